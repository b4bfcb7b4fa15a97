"""Random-weight checkpoints for the GPU benchmark, transformers baselines, and the correctness checks.

- `make_checkpoint`: a Llama checkpoint folder with random weights (transformers' own init) and a
  word-level tokenizer over the whole vocabulary ("w0 w1 ..."), so our gateway, transformers serve
  and the load generator all work on it without downloads.
- `hf_generate_step_ms` / `hf_generate_tok_s`: transformers `generate` (eager, dynamic cache).
- `check_logits`: our model's prompt logits vs transformers' on the same checkpoint (bf16 tolerance).
- `check_greedy_fp32`: greedy ids of our engine (batched, CUDA graphs) vs transformers, fp32.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import torch

LLAMA_1B = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True, head_dim=64)
# A draft for LLAMA_1B in the spirit of Llama-3.2's small siblings: same vocabulary and tokenizer, 2 layers.
LLAMA_1B_DRAFT = dict(hidden_size=512, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                      intermediate_size=1536, vocab_size=128256, tie_word_embeddings=True, head_dim=64)
SMALL = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=512, vocab_size=2048, tie_word_embeddings=False, head_dim=32)


def make_checkpoint(folder: Path, shape: dict[str, Any], dtype: torch.dtype, *, init_std: float = 0.02,
                    max_positions: int = 8192, seed: int = 0) -> Path:
    """Save a random Llama of `shape` and a word-level tokenizer to `folder` (skipped when present)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if (folder / "config.json").exists():
        return folder
    vocab = shape["vocab_size"]
    eos = vocab - 1
    config = LlamaConfig(**shape, max_position_embeddings=max_positions, rms_norm_eps=1e-5, rope_theta=500000.0,
                         initializer_range=init_std, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    torch.manual_seed(seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(config).to(dtype)
    model.generation_config.eos_token_id = eos
    model.save_pretrained(folder)
    words = {f"w{i}": i for i in range(vocab - 1)} | {"<|endoftext|>": eos}
    tok = Tokenizer(models.WordLevel(words, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                            pad_token="<|endoftext|>", unk_token="<|endoftext|>").save_pretrained(folder)
    del model
    torch.cuda.empty_cache()
    return folder


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """`n` prompts of `length` random ids (the eos id excluded), distinct across seeds."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab - 1, (n, length), generator=g).tolist()


def _hf_model(folder: Path, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to("cuda").eval()


@torch.inference_mode()
def hf_generate(folder: Path, dtype: torch.dtype, batch1_tokens: int, batch: int, prompt_len: int,
                new_tokens: int) -> dict[str, float]:
    """transformers generate, greedy, exact lengths: ms per decode step at batch 1, and output tok/s at `batch`."""
    model = _hf_model(folder, dtype)
    vocab = model.config.vocab_size

    def run(prompts: list[list[int]], n: int) -> float:
        ids = torch.tensor(prompts, device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                       do_sample=False, pad_token_id=vocab - 1)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    one = random_prompts(1, prompt_len, vocab, 1)
    run(one, 4)  # warm-up
    t_long, t_short = run(one, batch1_tokens + 1), run(one, 1)
    many = random_prompts(batch, prompt_len, vocab, 2)
    run(many, 2)
    t_batch = run(many, new_tokens)
    del model
    torch.cuda.empty_cache()
    return {"batch1_step_ms": (t_long - t_short) / batch1_tokens * 1e3,
            f"batch{batch}_output_tok_s": batch * new_tokens / t_batch}


@torch.inference_mode()
def check_logits(folder: Path, prompt_len: int = 200) -> dict[str, Any]:
    """Prompt logits of our runner (Triton prefill over the paged cache, in two chunks) and of transformers,
    both bf16, each against transformers in fp32. Pass: our error is within 1.5x of transformers' own
    bf16 error (random weights give nearly flat logits, so an absolute bound says little)."""
    from runtime.model_runner import ModelRunner, StepInput
    from runtime.models import load_model
    from runtime.sampler import Sampler

    hf = _hf_model(folder, torch.float32)
    ids = random_prompts(1, prompt_len, hf.config.vocab_size, 3)[0]
    ref = hf(torch.tensor([ids], device="cuda")).logits[0].float()
    hf = hf.to(torch.bfloat16)
    hf_bf16 = hf(torch.tensor([ids], device="cuda")).logits[0].float()
    del hf
    ours = ModelRunner(load_model(str(folder), torch.bfloat16, torch.device("cuda")), 16, Sampler())
    blocks = -(-prompt_len // 16) + 1
    ours.allocate_kv_cache(blocks)
    # the second chunk attends to cached context through the block table (blocks in reverse order)
    table = list(range(blocks))[::-1]
    half = prompt_len // 2
    a = ours.execute([StepInput(ids[:half], 0, table, return_all_logits=True)])[0].all_logits
    b = ours.execute([StepInput(ids[half:], half, table, return_all_logits=True)])[0].all_logits
    got = torch.cat([a, b]).to(ref.device)
    del ours
    torch.cuda.empty_cache()

    def rel(x: torch.Tensor) -> float:
        return ((x - ref).norm() / ref.norm()).item()

    ours_err, hf_err = rel(got), rel(hf_bf16)
    return {"ours_vs_fp32": ours_err, "hf_bf16_vs_fp32": hf_err,
            "ours_vs_hf_bf16": ((got - hf_bf16).norm() / hf_bf16.norm()).item(),
            "argmax_agreement_vs_fp32": (got.argmax(-1) == ref.argmax(-1)).float().mean().item(),
            "hf_bf16_argmax_agreement_vs_fp32": (hf_bf16.argmax(-1) == ref.argmax(-1)).float().mean().item(),
            "pass": ours_err <= 1.5 * hf_err + 1e-3}


def check_greedy_fp32(folder: Path, num_prompts: int = 4, steps: int = 32) -> dict[str, Any]:
    """Greedy ids for `steps` tokens: our engine (prompts batched, decode through CUDA graphs) vs
    transformers generate one prompt at a time, both fp32 without TF32."""
    from runtime.config import EngineConfig
    from runtime.llm_engine import NativeEngine
    from runtime.request import GenerationRequest, SamplingOptions

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    hf = _hf_model(folder, torch.float32)
    vocab = hf.config.vocab_size
    prompts = [random_prompts(1, n, vocab, 10 + n)[0] for n in (5, 17, 40, 100)[:num_prompts]]
    with torch.inference_mode():
        expected = []
        for p in prompts:
            out = hf.generate(torch.tensor([p], device="cuda"), max_new_tokens=steps, min_new_tokens=steps,
                              do_sample=False, pad_token_id=vocab - 1)
            expected.append(out[0, len(p):].tolist())
    del hf

    async def ours() -> list[list[int]]:
        engine = NativeEngine(EngineConfig(model=str(folder), device="cuda", dtype="float32", max_batch_size=8,
                                           max_kv_tokens=4096, max_model_len=1024))
        await engine.start()
        try:
            async def one(i: int, p: list[int]) -> list[int]:
                req = GenerationRequest(f"g{i}", prompt_token_ids=p,
                                        sampling=SamplingOptions(max_tokens=steps, temperature=0.0, ignore_eos=True))
                ids: list[int] = []
                async for delta in engine.generate(req):
                    ids.extend(delta.token_ids)
                return ids
            return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))
        finally:
            await engine.shutdown()

    got = asyncio.run(ours())
    torch.cuda.empty_cache()
    first_diff = [next((j for j, (a, b) in enumerate(zip(g, e)) if a != b), None) for g, e in zip(got, expected)]
    return {"equal": got == expected, "first_mismatch_step": first_diff, "steps": steps, "prompts": len(prompts)}
