"""How many tokens a step may hold (--max-num-tokens) when the user does not say.

A step's prompt tokens are chunks of prefill beside the running sequences' decode rows, which wait for the whole
step. On CUDA the right size depends on the model: on an H200 (benchmarks/RESULTS.md, 2026-11-29, issue 48) the
1B Llama shape served 40% more tokens a second at 8,192 tokens a step than at 2,048, with a lower inter-token
latency too, while the 8B shape gained 3% at 4,096 and its p99 inter-token latency doubled (a 4,096-token step takes
~100 ms there). What they share is the step's time, so the default holds a step's products near STEP_FLOPS:
8,192 tokens for 1B models and smaller, 2,048 for 8B ones, 4,096 between (Qwen3-30B-A3B's 3B active weights).
FP8 weights on FP8 tensor cores multiply at twice the rate, so their products count half: 4,096 tokens for an 8B
FP8 model (256 x 128/128 on an H200: +1.4-3% over 2,048, RESULTS.md 2026-11-29 23:50).
On CPU steps are slow at any size: 2,048 as before.
"""

from __future__ import annotations

from runtime.model_spec import ModelSpec

STEP_FLOPS = 40e12  # ~50 ms of bf16 products on an H100/H200
MIN_TOKENS, MAX_TOKENS = 2048, 8192  # the measured range (MAX: beyond it the activations' memory grows for little)
CPU_TOKENS = 2048


def weights_per_token(spec: ModelSpec) -> int:
    """Weights a prompt token multiplies: the decoder layers' projections (the chosen experts only in a
    mixture-of-experts layer); not the output embedding, which a prefill runs for its last token alone."""
    hidden, moe = spec.hidden_size, spec.moe
    attention = hidden * spec.head_dim * 2 * (spec.num_heads + spec.num_kv_heads)  # q, k, v and o
    intermediate = int(spec.config.get("intermediate_size") or spec.config.get("n_inner") or 4 * hidden)
    total = 0
    for layer in range(spec.num_layers):
        sparse = moe is not None and moe.sparse_layers[layer]
        mlp = 3 * hidden * (moe.intermediate_size * moe.top_k if sparse and moe else intermediate)  # gate, up, down
        total += attention + mlp
    return total


def default_max_num_tokens(spec: ModelSpec, device_type: str, fp8_products: bool = False) -> int:
    """The largest power of 2 of tokens whose products stay within STEP_FLOPS, in [MIN_TOKENS, MAX_TOKENS] (CUDA; FP8
    products count half); CPU_TOKENS elsewhere."""
    if device_type != "cuda":
        return CPU_TOKENS
    flops_per_token = 2 * weights_per_token(spec) / (2 if fp8_products else 1)
    tokens = MIN_TOKENS
    while tokens * 2 <= MAX_TOKENS and tokens * 2 * flops_per_token <= STEP_FLOPS:
        tokens *= 2
    return tokens
