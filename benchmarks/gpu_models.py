"""Random-weight checkpoints for the GPU benchmark, transformers baselines, and the correctness checks.

- `make_checkpoint`: a Llama checkpoint folder with random weights (as transformers initializes them) and a
  word-level tokenizer over the whole vocabulary ("w0 w1 ..."), so our gateway, transformers serve
  and the load generator all work on it without downloads.
- `hf_generate_step_ms` / `hf_generate_tok_s`: transformers `generate` (eager, dynamic cache).
- `check_logits`: our model's prompt logits vs transformers' on the same checkpoint (bf16 tolerance).
- `check_greedy_fp32`: greedy ids of our engine (batched, CUDA graphs) vs transformers, fp32.
  Each takes a `device` ("cuda"; "cpu" for gpu_bench --smoke, which runs them on the TINY shape).
- `widen_checkpoint`: the trained demo model widened to a 1B shape that computes the same function, so
  speculation on the GPU pays a 1B model's weight traffic per step with the demo's real acceptance.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from runtime.tokenizer import bytes_to_unicode

LLAMA_1B = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True, head_dim=64)
# A draft for LLAMA_1B in the spirit of Llama-3.2's small siblings: same vocabulary and tokenizer, 2 layers.
LLAMA_1B_DRAFT = dict(hidden_size=512, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                      intermediate_size=1536, vocab_size=128256, tie_word_embeddings=True, head_dim=64)
# the default model's shape (SmolLM2-135M-Instruct)
SMOLLM2_135M = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True, head_dim=64)
SMALL = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=512, vocab_size=2048, tie_word_embeddings=False, head_dim=32)
# gpu_bench --smoke: every phase's code in seconds, on the CPU too (tests/benchmarks)
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=512, tie_word_embeddings=False, head_dim=16)


def make_checkpoint(folder: Path, shape: dict[str, Any], dtype: torch.dtype, *, init_std: float = 0.02,
                    max_positions: int = 8192, seed: int = 0) -> Path:
    """Save a random Llama of `shape` and a byte-level tokenizer to `folder` (skipped when present): the files
    transformers' LlamaForCausalLM saves, with its init (N(0, init_std) matrices, the padding id's embedding row
    zero, unit norms), written here: importing its model classes took 3 s of CPU per benchmark start."""
    if (folder / "config.json").exists():
        return folder
    from safetensors.torch import save_file

    vocab, hidden, layers = shape["vocab_size"], shape["hidden_size"], shape["num_hidden_layers"]
    eos = vocab - 1
    ids = dict(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    heads = shape["num_attention_heads"]
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
              "attention_dropout": 0.0, "hidden_act": "silu", "mlp_bias": False, "pretraining_tp": 1,
              "tie_word_embeddings": False, "use_cache": True, "num_key_value_heads": heads,
              "head_dim": hidden // heads, **shape, "max_position_embeddings": max_positions, "rms_norm_eps": 1e-5,
              "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}, "initializer_range": init_std,
              "dtype": str(dtype).removeprefix("torch."), **ids}
    q, kv = heads * config["head_dim"], config["num_key_value_heads"] * config["head_dim"]
    inter = config["intermediate_size"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device).manual_seed(seed)

    def matrix(rows: int, cols: int) -> torch.Tensor:
        return torch.empty(rows, cols, device=device).normal_(0.0, init_std, generator=gen).to(dtype).cpu()

    def ones() -> torch.Tensor:
        return torch.ones(hidden, dtype=dtype)

    embed = matrix(vocab, hidden)
    embed[eos] = 0  # the padding id's row, as nn.Embedding(padding_idx) is initialized
    weights = {"model.embed_tokens.weight": embed, "model.norm.weight": ones()}
    for i in range(layers):
        layer = f"model.layers.{i}."
        weights |= {layer + "self_attn.q_proj.weight": matrix(q, hidden), layer + "self_attn.k_proj.weight":
                    matrix(kv, hidden), layer + "self_attn.v_proj.weight": matrix(kv, hidden),
                    layer + "self_attn.o_proj.weight": matrix(hidden, q), layer + "mlp.gate_proj.weight":
                    matrix(inter, hidden), layer + "mlp.up_proj.weight": matrix(inter, hidden),
                    layer + "mlp.down_proj.weight": matrix(hidden, inter),
                    layer + "input_layernorm.weight": ones(), layer + "post_attention_layernorm.weight": ones()}
    if not config["tie_word_embeddings"]:
        weights["lm_head.weight"] = matrix(vocab, hidden)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "generation_config.json").write_text(json.dumps(ids, indent=2) + "\n")
    write_tokenizer(folder, vocab)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")  # last: complete
    return folder


def write_tokenizer(folder: Path, vocab: int) -> None:
    """A word-level tokenizer over the whole vocabulary, byte-level as Llama 3's: the 256 byte pieces, then " w<i>"
    words ("Ġ" is the space byte's piece); the last id is eos."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    eos = vocab - 1
    byte_chars = list(bytes_to_unicode().values())
    pieces = byte_chars + [f"\u0120w{i}" for i in range(vocab - 1 - len(byte_chars))]
    words = {piece: i for i, piece in enumerate(pieces)} | {"<|endoftext|>": eos}
    tok = Tokenizer(models.WordLevel(words, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                            pad_token="<|endoftext|>", unk_token="<|endoftext|>").save_pretrained(folder)


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """`n` prompts of `length` random ids (the eos id excluded), distinct across seeds."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab - 1, (n, length), generator=g).tolist()


def _hf_model(folder: Path, dtype: torch.dtype, device: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()


def synchronize(device: str) -> None:
    """Wait for the device's queued work (a no-op on the CPU, where every op is synchronous)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


@torch.inference_mode()
def hf_generate(folder: Path, dtype: torch.dtype, batch1_tokens: int, batch: int, prompt_len: int,
                new_tokens: int, device: str = "cuda") -> dict[str, float]:
    """transformers generate, greedy, exact lengths: ms per decode step at batch 1, and output tok/s at `batch`."""
    return hf_generate_model(_hf_model(folder, dtype, device), batch1_tokens, batch, prompt_len, new_tokens, device)


@torch.inference_mode()
def hf_generate_model(model: Any, batch1_tokens: int, batch: int, prompt_len: int, new_tokens: int,
                      device: str = "cuda") -> dict[str, float]:
    """`hf_generate` on a transformers model already on `device` (it is deleted after; batch1_tokens 0: the batch
    figure only)."""
    vocab = model.config.vocab_size

    def run(prompts: list[list[int]], n: int) -> float:
        ids = torch.tensor(prompts, device=device)
        synchronize(device)
        t0 = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                       do_sample=False, pad_token_id=vocab - 1)
        synchronize(device)
        return time.perf_counter() - t0

    res: dict[str, float] = {}
    if batch1_tokens:
        one = random_prompts(1, prompt_len, vocab, 1)
        run(one, 4)  # warm-up
        t_long, t_short = run(one, batch1_tokens + 1), run(one, 1)
        res["batch1_step_ms"] = (t_long - t_short) / batch1_tokens * 1e3
    many = random_prompts(batch, prompt_len, vocab, 2)
    run(many, 2)
    res[f"batch{batch}_output_tok_s"] = batch * new_tokens / run(many, new_tokens)
    del model
    torch.cuda.empty_cache()
    return res


@torch.inference_mode()
def check_logits(folder: Path, prompt_len: int = 200, device: str = "cuda") -> dict[str, Any]:
    """Prompt logits of our runner (Triton prefill over the paged cache, in two chunks) and of transformers,
    both bf16, each against transformers in fp32. Pass: our error is within 1.5x of transformers' own
    bf16 error (random weights give nearly flat logits, so an absolute bound says little)."""
    from runtime.native.model_runner import ModelRunner
    from runtime.native.models import load_model
    from runtime.native.sampler import Sampler
    from runtime.native.step_inputs import StepInput

    hf = _hf_model(folder, torch.float32, device)
    ids = random_prompts(1, prompt_len, hf.config.vocab_size, 3)[0]
    ref = hf(torch.tensor([ids], device=device)).logits[0].float()
    hf = hf.to(torch.bfloat16)
    hf_bf16 = hf(torch.tensor([ids], device=device)).logits[0].float()
    del hf
    ours = ModelRunner(load_model(str(folder), torch.bfloat16, torch.device(device)), 16, Sampler())
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


def check_greedy_fp32(folder: Path, num_prompts: int = 4, steps: int = 32, device: str = "cuda") -> dict[str, Any]:
    """Greedy ids for `steps` tokens: our engine (prompts batched, decode through CUDA graphs) vs
    transformers generate one prompt at a time, both fp32 without TF32."""
    from runtime.config import EngineConfig
    from runtime.native.llm_engine import NativeEngine
    from runtime.request import GenerationRequest, SamplingOptions

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    hf = _hf_model(folder, torch.float32, device)
    vocab = hf.config.vocab_size
    prompts = [random_prompts(1, n, vocab, 10 + n)[0] for n in (5, 17, 40, 100)[:num_prompts]]
    with torch.inference_mode():
        expected = []
        for p in prompts:
            out = hf.generate(torch.tensor([p], device=device), max_new_tokens=steps, min_new_tokens=steps,
                              do_sample=False, pad_token_id=vocab - 1)
            expected.append(out[0, len(p):].tolist())
    del hf

    async def ours() -> list[list[int]]:
        engine = NativeEngine(EngineConfig(model=str(folder), device=device, dtype="float32", max_batch_size=8,
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


def widen_checkpoint(src: Path, dst: Path, *, hidden_size: int = 2048, num_hidden_layers: int = 16,
                     intermediate_size: int = 8192, num_attention_heads: int = 64, num_key_value_heads: int = 16,
                     dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> Path:
    """Write to `dst` a Llama of the given shape that computes exactly the function of the Llama in `src`.

    Replication, not zero padding: with c = hidden_size / src hidden (an integer; heads and KV heads must
    grow by the same c, head_dim, vocabulary, rope and tokenizer stay), the residual stream holds c copies
    of the source's residual scaled by 1/c, and every attention head and KV head is present c times
    (q head i still reads KV head i // group). So
    - embeddings (and the lm_head, tied or not): the source matrix tiled c times along hidden, / c; the
      tied lm_head then sums c copies of (normed state . row / c) = the source logits;
    - q/k/v: tiled c x c, / c (each copy of a head reads the c copies of the normed state);
      o_proj: tiled c x c, / c^2 (c head copies in, a 1/c-scaled copy out to each residual copy);
    - MLP: the source's units m times (m = largest power of two with m * src units <= intermediate_size),
      gate/up tiled m x c, / c, down tiled c x m, / (c m); the remaining units are inert (zero down columns);
    - RMSNorm: scale-invariant, so the norm weights are tiled as they are; the 1/c residual scale is
      compensated in rms_norm_eps, which becomes eps / c^2 (the mean of squares is 1/c^2 of the source's),
      so nothing about the norm changes, eps included;
    - layers past the source's: identity (zero o_proj and down_proj add exactly zero to the residual).
    With c and m powers of two (2048/256 = 8, 8192/704 -> 8) every scale is exact in bf16 (no weight is
    rounded), so in bf16 the widened model differs from the bf16 source only as kernels' rounding does;
    the whole hidden width carries real activations (no zero dimensions).

    Inert parts (new layers' q/k/v/gate/up, spare MLP units' gate/up) get N(0, 0.02) weights, not
    zeros: dense kernels cost the same whatever the values, and random inputs keep every tensor of a
    realistic magnitude (an all-zero q gives a uniform softmax, a quantiser an amax of 0); only the
    outputs that must vanish are zero. Built in `dtype` on the GPU when there is one, layer by layer,
    with progress lines; the tokenizer, chat template and generation config are copied from `src`.
    """
    from safetensors.torch import load_file, save_file

    cfg = json.loads((src / "config.json").read_text())
    h, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or h // heads
    inter, layers = cfg["intermediate_size"], cfg["num_hidden_layers"]
    c = hidden_size // h
    if cfg.get("model_type") != "llama" or cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ValueError("widen_checkpoint handles bias-free Llama checkpoints only")
    if hidden_size != c * h or num_attention_heads != c * heads or num_key_value_heads != c * kv:
        raise ValueError(f"hidden {hidden_size}, heads {num_attention_heads}, kv heads {num_key_value_heads} must be "
                         f"the same integer multiple of the source's {h}, {heads}, {kv} (head_dim {head_dim} stays)")
    if intermediate_size < inter or num_hidden_layers < layers:
        raise ValueError(f"intermediate_size >= {inter} and num_hidden_layers >= {layers} required")
    m = 1 << ((intermediate_size // inter).bit_length() - 1)  # MLP copies: a power of two
    spare = intermediate_size - m * inter
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator(device=device).manual_seed(seed)
    source = {k: v.to(device, torch.float32) for k, v in load_file(src / "model.safetensors").items()}

    def tile(w: torch.Tensor, rows: int, cols: int, scale: float) -> torch.Tensor:
        return (w.repeat(rows, cols) * scale).to(dtype)

    def inert(rows: int) -> torch.Tensor:
        return torch.randn(rows, hidden_size, device=device, dtype=dtype, generator=gen) * 0.02

    def zeros(rows: int, cols: int) -> torch.Tensor:
        return torch.zeros(rows, cols, device=device, dtype=dtype)

    out: dict[str, torch.Tensor] = {}
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in source:
            out[name] = tile(source[name], 1, c, 1 / c)
    out["model.norm.weight"] = source["model.norm.weight"].repeat(c).to(dtype)
    t0 = time.perf_counter()
    for i in range(num_hidden_layers):
        pre = f"model.layers.{i}."
        s = {k.removeprefix(pre): v for k, v in source.items() if k.startswith(pre)}
        if s:
            layer = {"self_attn.o_proj.weight": tile(s["self_attn.o_proj.weight"], c, c, 1 / c**2),
                     "mlp.down_proj.weight": torch.cat([tile(s["mlp.down_proj.weight"], c, m, 1 / (c * m)),
                                                        zeros(hidden_size, spare)], 1)}
            for n in ("q_proj", "k_proj", "v_proj"):
                layer[f"self_attn.{n}.weight"] = tile(s[f"self_attn.{n}.weight"], c, c, 1 / c)
            for n in ("gate_proj", "up_proj"):
                layer[f"mlp.{n}.weight"] = torch.cat([tile(s[f"mlp.{n}.weight"], m, c, 1 / c), inert(spare)])
            for n in ("input_layernorm", "post_attention_layernorm"):
                layer[f"{n}.weight"] = s[f"{n}.weight"].repeat(c).to(dtype)
        else:  # identity layer: costs like a real one, adds exactly zero
            layer = {"self_attn.q_proj.weight": inert(num_attention_heads * head_dim),
                     "self_attn.k_proj.weight": inert(num_key_value_heads * head_dim),
                     "self_attn.v_proj.weight": inert(num_key_value_heads * head_dim),
                     "self_attn.o_proj.weight": zeros(hidden_size, num_attention_heads * head_dim),
                     "mlp.gate_proj.weight": inert(intermediate_size), "mlp.up_proj.weight": inert(intermediate_size),
                     "mlp.down_proj.weight": zeros(hidden_size, intermediate_size),
                     "input_layernorm.weight": torch.ones(hidden_size, device=device, dtype=dtype),
                     "post_attention_layernorm.weight": torch.ones(hidden_size, device=device, dtype=dtype)}
        out.update({pre + k: v.to("cpu").contiguous() for k, v in layer.items()})
        print(f"widen: layer {i + 1}/{num_hidden_layers} ({'source layer' if s else 'identity'}) "
              f"{time.perf_counter() - t0:.1f}s", flush=True)
    out = {k: v.to("cpu").contiguous() for k, v in out.items()}
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():  # tokenizer, chat template, generation config
        if f.is_file() and f.name not in ("config.json", "model.safetensors"):
            shutil.copy(f, dst / f.name)
    cfg.update(hidden_size=hidden_size, num_hidden_layers=num_hidden_layers, intermediate_size=intermediate_size,
               num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads, head_dim=head_dim,
               rms_norm_eps=cfg.get("rms_norm_eps", 1e-6) / c**2, dtype=str(dtype).removeprefix("torch."))
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    params = sum(v.numel() for v in out.values())
    gib = params * out["model.norm.weight"].element_size() / 2**30
    print(f"widen: {dst} {params / 1e9:.3f}B params, {gib:.2f} GiB, c={c} mlp copies={m} spare units={spare}, "
          f"{time.perf_counter() - t0:.1f}s", flush=True)
    return dst
