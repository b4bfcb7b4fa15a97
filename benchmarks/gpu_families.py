"""Issue 43's figures: the new families at real shapes on one GPU, random bf16 weights, baselines in the same run.

    python -m benchmarks.gpu_families --out /tmp/families             # on an H200: under 9 minutes
    python -m benchmarks.gpu_families --out DIR --shapes qwen3-30b-a3b --skip hf
    python -m benchmarks.gpu_families --smoke --device cpu --out DIR   # tiny shapes on the CPU, seconds

Shapes (SHAPES): Llama-3.1-8B, Qwen3-8B and Qwen3-30B-A3B, from transformers' own config classes. Weights are
N(0, 0.02), made on the device: no checkpoint is written (the 30B one would be 61 GB); the engine's loader is
replaced, in this process, by `random_model`, which builds our model from config.json and fills it. Per shape:
  floor_b1_ms        what a batch-1 decode step must read (every weight; for MoE the attention, router and norms
                     plus the k chosen experts of each layer; the output head; one embedding row; the KV of the
                     context) over the measured copy bandwidth (`bandwidth`, bytes read + written per second)
  decode_b1_itl_ms   median inter-token gap of one stream (128-token prompt, 64 tokens): NativeEngine in this
                     process, CUDA graphs, as gpu_bench measures it; `vs_floor` = it / floor
  throughput_256     256 requests of 128 in / 128 out submitted at once: output tok/s
  hf_256             transformers `generate` at batch 256, 128 in / 128 out (greedy, exact lengths), output tok/s:
                     the MoE shape by default (--hf-shapes)
The MoE shape's throughput is also put beside the dense 8B's of the same run (`moe_vs_dense_8b`). Results go to
DIR/gpu_families.json after every phase; a phase that raises is recorded with its traceback, the others still run,
and the run exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks import gpu_models as gm
from benchmarks.gpu_bench import _request, _stream, bandwidth_tb_s

COMMON = dict(max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False)
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-3.1-8b": ("llama", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                   num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                   rope_theta=500000.0)),
    "qwen3-8b": ("qwen3", dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                               num_key_value_heads=8, head_dim=128, vocab_size=151936, rope_theta=1000000.0)),
    "qwen3-30b-a3b": ("qwen3_moe", dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                                        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                                        head_dim=128, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                                        vocab_size=151936, rope_theta=1000000.0)),
}
# --smoke: every phase's code on tiny shapes of the same families
SMOKE_SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-3.1-8b": ("llama", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=512)),
    "qwen3-8b": ("qwen3", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=16, vocab_size=512)),
    "qwen3-30b-a3b": ("qwen3_moe", dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, vocab_size=512)),
}
PROMPT, OUTPUT, BATCH = 128, 128, 256
# gaps: the batch-1 inter-token gaps timed (default 63); warmup: tokens per warm-up request (default 8)
SMOKE_SIZES = dict(prompt=16, output=2, batch=8, gaps=1, warmup=2)


def hf_config(model_type: str, shape: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    vocab = shape["vocab_size"]
    ids = dict(bos_token_id=vocab - 1, eos_token_id=vocab - 1, pad_token_id=vocab - 1)
    return AutoConfig.for_model(model_type, **{**COMMON, **shape, **ids})


def write_config(folder: Path, model_type: str, shape: dict[str, Any]) -> Path:
    """config.json and a tokenizer (benchmarks/gpu_models.py), no weights: `random_model` makes those."""
    folder.mkdir(parents=True, exist_ok=True)
    config = hf_config(model_type, shape)
    config.architectures = [{"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM",
                             "qwen3_moe": "Qwen3MoeForCausalLM"}[model_type]]
    config.dtype = "bfloat16"
    config.save_pretrained(folder)
    gm.write_tokenizer(folder, shape["vocab_size"])
    return folder


@torch.inference_mode()
def random_model(path: str, dtype: torch.dtype | None = None, device: torch.device | str = "cpu",
                 context_window: int | None = None, quantization: str = "none", int4_kernels: bool = False) -> Any:
    """runtime.native.models.load_model's signature: our model for `path`/config.json, N(0, 0.02) matrices, unit norms
    (quantization "fp8": then quantized as --quantization fp8 quantizes a checkpoint; `int4_kernels` has nothing to
    keep: benchmarks/gpu_quant.py's random_int4_model makes INT4 forms)."""
    from runtime.architectures import check_supported
    from runtime.native.device import DTYPES
    from runtime.model_spec import ModelSpec
    from runtime.native.models.fp8_checkpoint import quantize_model
    from runtime.native.models.registry import model_class

    spec = ModelSpec.from_pretrained(path)
    spec.context_window = context_window or spec.context_window
    check_supported(spec)
    with torch.device(device):
        model = model_class(spec.architecture)(spec, dtype or DTYPES[spec.dtype])
    gen = torch.Generator(device=device).manual_seed(0)
    for param in model.parameters():
        if param.dim() > 1:
            param.normal_(0.0, 0.02, generator=gen)
        else:
            param.fill_(1.0)
    if quantization == "fp8":
        quantize_model(model)
    return model.eval()


def floor_bytes(model: Any, context: int) -> int:
    """Bytes a batch-1 decode step at `context` tokens reads (module docstring)."""
    spec = model.spec
    moe = spec.moe
    total = 0
    for name, param in model.named_parameters():
        size = param.numel() * param.element_size()
        if name.endswith("embed_tokens.weight") and model.lm_head is not None:
            size = param.shape[1] * param.element_size()  # one row (the output head is its own matrix)
        elif ".experts." in name and moe is not None:
            size = size * moe.top_k // moe.num_experts
        total += size
    element = next(model.parameters()).element_size()
    return total + 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * context * element


async def engine_figures(folder: Path, device: str, sizes: dict[str, int], **options: Any) -> dict[str, Any]:
    """Batch-1 inter-token gaps and 256 x 128/128 output tok/s through NativeEngine (random weights); `options`:
    more EngineConfig fields."""
    from runtime.config import EngineConfig
    from runtime.native.llm_engine import NativeEngine

    prompt, output, batch = sizes["prompt"], sizes["output"], sizes["batch"]
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    context = 2048 if batch == BATCH else 256
    cfg = EngineConfig(model=str(folder), device=device, dtype="bfloat16", max_batch_size=batch,
                       max_kv_tokens=max(batch * (prompt + output) * 2, context),
                       max_model_len=context, enable_prefix_caching=False, **options)
    t0 = time.perf_counter()
    engine = NativeEngine(cfg)
    await engine.start()
    res: dict[str, Any] = {"load_s": time.perf_counter() - t0,
                           "floor_bytes": floor_bytes(engine.runner.model, prompt + 32)}
    try:
        await asyncio.gather(*(_stream(engine, _request(f"w{i}", p, sizes.get("warmup", 8)))
                               for i, p in enumerate(gm.random_prompts(batch, prompt, vocab, 1))))
        itl_prompt = gm.random_prompts(1, prompt, vocab, 2)[0]
        # the first token's arrival and the first gap (its step's start) are not timed
        _, arrivals, _ = await _stream(engine, _request("itl", itl_prompt, sizes.get("gaps", 63) + 2))
        gaps = [b - a for a, b in zip(arrivals[1:], arrivals[2:])]
        res["decode_b1_itl_ms"] = statistics.median(gaps) * 1e3
        prompts = gm.random_prompts(batch, prompt, vocab, 3)
        t = time.perf_counter()
        done = await asyncio.gather(*(_stream(engine, _request(f"tp{i}", p, output)) for i, p in enumerate(prompts)))
        res[f"throughput_{batch}_tok_s"] = sum(d[2] for d in done) / (time.perf_counter() - t)
    finally:
        await engine.shutdown()
    return res


def hf_figures(model_type: str, shape: dict[str, Any], device: str, sizes: dict[str, int]) -> dict[str, float]:
    """transformers generate at batch 256 on the same shape, random weights made on the device."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config(model_type, shape), dtype=torch.bfloat16).eval()
    return gm.hf_generate_model(model, 0, sizes["batch"], sizes["prompt"], sizes["output"], device)


class Phases:
    """A device run's phases: each one's result (or its traceback: the later phases still run) goes into `results`,
    printed and written to `path` as it ends; the memory it freed goes back to the device before the next."""

    def __init__(self, path: Path, results: dict[str, Any], printed: int = 300) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.results, self.printed = path, results, printed
        self.failed = False

    def record(self, key: str, run: Callable[[], Any]) -> Any:
        t = time.perf_counter()
        try:
            self.results[key] = run()
        except Exception:  # noqa: BLE001 - a phase's failure is recorded, the later phases still run
            self.failed = True
            self.results[key] = {"error": traceback.format_exc()}
            print(self.results[key]["error"], file=sys.stderr)
        if torch.cuda.is_available():  # a phase's model (61 GB for the MoE shape) freed before the next one's (the
            # CPU runs smoke shapes, and a full collection costs ~1 s in a test worker's heap, a phase at a time)
            gc.collect()
            torch.cuda.empty_cache()
        print(f"{self.path.stem}: {key} {time.perf_counter() - t:.1f}s: {json.dumps(self.results[key])[:self.printed]}",
              flush=True)
        self.write()
        return self.results[key]

    def write(self) -> None:
        self.path.write_text(json.dumps(self.results, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--hf-shapes", default="qwen3-30b-a3b", help="shapes that also get the transformers baseline")
    parser.add_argument("--skip", default="", help="comma-separated phases to leave out: engine, hf")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and loads: the code runs, nothing more")
    args = parser.parse_args(argv)
    import runtime.native.core_loader

    runtime.native.core_loader.load_model = random_model  # random weights at real shapes, no checkpoint on disk
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    sizes = SMOKE_SIZES if args.smoke else dict(prompt=PROMPT, output=OUTPUT, batch=BATCH)
    skip = set(filter(None, args.skip.split(",")))
    phases = Phases(args.out / "gpu_families.json", {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device, "sizes": sizes,
        "date": time.strftime("%Y-%m-%d")})
    results, record = phases.results, phases.record
    bandwidth = record("bandwidth_tb_s", lambda: bandwidth_tb_s(1 / 64 if args.smoke else 1.0, args.device))
    for name in args.shapes.split(","):
        model_type, shape = shapes[name]
        folder = write_config(args.out / name, model_type, shape)
        if "engine" not in skip:
            figures = record(name, lambda: asyncio.run(engine_figures(folder, args.device, sizes)))
            if "error" not in figures and isinstance(bandwidth, float):
                figures["floor_b1_ms"] = figures["floor_bytes"] / (bandwidth * 1e12) * 1e3
                figures["vs_floor"] = figures["decode_b1_itl_ms"] / figures["floor_b1_ms"]
        if "hf" not in skip and name in args.hf_shapes.split(","):
            record(f"{name}_hf_{sizes['batch']}", lambda: hf_figures(model_type, shape, args.device, sizes))
    moe, dense = results.get("qwen3-30b-a3b", {}), results.get("qwen3-8b", {})
    key = f"throughput_{sizes['batch']}_tok_s"
    if key in moe and key in dense:
        results["moe_vs_dense_8b"] = moe[key] / dense[key]
    phases.write()
    return 1 if phases.failed else 0


if __name__ == "__main__":
    sys.exit(main())
