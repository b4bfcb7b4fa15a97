"""Issue 44's FP8 and INT4 figures on one GPU, same run, Llama-3.1-8B shape, random weights: bf16 vs FP8
(--quantization fp8), and the INT4 kernels.

    python -m benchmarks.gpu_quant --out /tmp/quant                   # on an H200: under 300 s
    TRITON_INTERPRET=1 python -m benchmarks.gpu_quant --smoke --device cpu --out DIR   # tiny shapes, seconds

Phases (each one's result, or its traceback, lands in DIR/gpu_quant.json as it ends; the run exits 1 if any raised):
  bandwidth_tb_s   the measured copy bandwidth (bytes read + written per second): the floors' rate
  kernels          per projection shape of the 8B (q/k/v, o, gate/up, down): the one-token GEMV (runtime/native/cuda/gemv.py)
                   on bf16 and on FP8 weights, each in us against its weight-bytes floor, FP8 also at a few other
                   tiles (FP8 rows are half the bytes: the bf16 tile table may not suit them); and a 256-row product,
                   cuBLAS bf16 vs FP8 tensor cores with per-token activation quantization (runtime/native/models/fp8.py);
                   INT4 (AWQ-style, groups of 128, runtime/native/cuda/int4.py): the one-token GEMV against its
                   weight-bytes floor (half a byte a weight, 3 bytes a group's zero point and scale) and the 256-row GEMM,
                   the GEMM also at a few other tiles (int4.GEMM_TILE)
  int4_gemv        the INT4 GEMV's tiles per projection shape against the floor (benchmarks/gpu_int4_gemv.py);
                   each shape's fastest becomes the int4 phase's GEMV (`int4_gemv_shapes`)
  bf16, fp8, int4  NativeEngine (CUDA graphs) over the 8B shape: batch-1 decode inter-token gap against the step's
                   weight-bytes floor (gpu_families.floor_bytes: FP8 weights count 1 byte, their scales 4 per row;
                   INT4 half a byte, 3 bytes a group), and 256 requests of 128 in / 128 out, output tok/s;
                   `fp8_vs_bf16` and `int4_vs_bf16` the throughput ratios. INT4: every decoder projection kept packed
                   as an AWQ checkpoint's are on CUDA, with random nibbles, zero points and scales (a checkpoint's
                   speed does not depend on its values)
  kv_fp8           the bf16 model over an FP8 KV cache (--kv-cache-dtype fp8, half the cache's bytes): the same
                   figures (the floor counts the cache at 2 bytes a value: a bound, not the floor), `kv_fp8_vs_bf16`
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks import gpu_families as gf
from benchmarks.cuda_decode_attention import per_call_us
from benchmarks.gpu_bench import bandwidth_tb_s

# the 8B's projections as (out, in): q/k/v, o, gate/up, down
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
SMOKE_SHAPES = {"qkv": (48, 128), "o": (32, 128), "gate_up": (64, 128), "down": (32, 256)}  # INT4: K of 128 groups;
# every size a multiple of 16, as FP8 tensor cores take (torch._scaled_mm; elsewhere fp8.py dequantizes)
INT4_GEMM_TILES = [(64, 64, 4, 3), (128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 4)]  # GEMM_TILE
# (BLOCK_N, BLOCK_K, warps); the 16- and 32-row tiles over short K steps share each program's NORM/SwiGLU prologue
# among more rows (its per-program cost weighs on FP8's half-size rows: RESULTS.md, 2026-11-29 ~10:45)
FP8_TILES = [(4, 2048, 4), (8, 2048, 8), (8, 4096, 8), (16, 1024, 4), (16, 2048, 8), (8, 512, 4), (16, 256, 4),
             (16, 512, 4), (32, 256, 4), (32, 512, 8)]
ROWS = 256
INT4_GROUP = 128
MIN_BYTES = 256 * 2**20  # weight copies per shape: more than the H200's 50 MB L2 holds


def kernel_figures(device: str, shapes: dict[str, tuple[int, int]], bandwidth: float, min_bytes: int,
                   sweep: bool = True) -> dict[str, Any]:
    """Per projection shape, the GEMV and 256-row figures (module docstring); `sweep`: also at the other tiles
    (a smoke run on the CPU leaves them out: each is minutes of Triton's interpreter there)."""
    from runtime.native.cuda import gemv as gemv_module
    from runtime.native.models.fp8 import dequantize, fp8_linear, quantize_rows

    g = torch.Generator().manual_seed(0)
    res: dict[str, Any] = {}
    for name, (n, k) in shapes.items():
        copies = max(2, -(-min_bytes // (n * k * 2)))
        bf16 = [(torch.randn(n, k, generator=g) * k**-0.5).to(device, torch.bfloat16) for _ in range(copies)]
        fp8 = [quantize_rows(w) for w in bf16]
        x = torch.randn(1, k, generator=g).to(device, torch.bfloat16)
        want = F.linear(x.float(), dequantize(*fp8[0], torch.float32))
        got = gemv_module.gemv(x, fp8[0][0], scale=fp8[0][1]).float()
        figures: dict[str, Any] = {"fp8_max_rel_err": ((got - want).abs().max() / want.abs().max()).item()}
        figures["bf16_us"] = per_call_us(lambda i: gemv_module.gemv(x, bf16[i]), copies)
        figures["fp8_us"] = per_call_us(lambda i: gemv_module.gemv(x, fp8[i][0], scale=fp8[i][1]), copies)
        figures["bf16_floor_us"] = n * k * 2 / (bandwidth * 1e12) * 1e6
        figures["fp8_floor_us"] = (n * k + 4 * n) / (bandwidth * 1e12) * 1e6
        figures["bf16_vs_floor"] = figures["bf16_us"] / figures["bf16_floor_us"]
        figures["fp8_vs_floor"] = figures["fp8_us"] / figures["fp8_floor_us"]
        tuned = gemv_module.FP8_TILES.get((n, k))
        for tile in FP8_TILES if sweep else []:
            gemv_module.FP8_TILES[(n, k)] = tile
            figures["fp8_tile_{}x{}x{}_us".format(*tile)] = per_call_us(
                lambda i: gemv_module.gemv(x, fp8[i][0], scale=fp8[i][1]), copies)
        # the engine phases after this one run the shipped tiles (the sweep once left them untuned: 3.42 ms, not 2.90)
        gemv_module.FP8_TILES.pop((n, k), None)
        if tuned:
            gemv_module.FP8_TILES[(n, k)] = tuned
        rows = torch.randn(ROWS, k, generator=g).to(device, torch.bfloat16)
        figures[f"rows_{ROWS}_bf16_us"] = per_call_us(lambda i: F.linear(rows, bf16[i]), copies)
        figures[f"rows_{ROWS}_fp8_us"] = per_call_us(lambda i: fp8_linear(rows, fp8[i][0], fp8[i][1], None, None),
                                                     copies)
        figures.update(_int4_figures(bf16[0], x, rows, copies, bandwidth, sweep))
        res[name] = figures
    return res


def _int4_figures(weight: torch.Tensor, x: torch.Tensor, rows: torch.Tensor, copies: int, bandwidth: float,
                  sweep: bool) -> dict[str, Any]:
    """The INT4 GEMV and GEMM on `weight` quantized round to nearest in groups of INT4_GROUP (on the CPU, once: the
    copies are clones), and the GEMV's error against the reference dequantization."""
    from runtime.native.cuda import int4
    from runtime.native.cuda.int4 import int4_linear, tile_major
    from runtime.native.models.int4_checkpoint import dequantize, kernel_layout, quantize_rtn

    n, k = weight.shape
    groups = torch.arange(k) // INT4_GROUP
    q, zeros, scales = quantize_rtn(weight.cpu(), groups, k // INT4_GROUP, symmetric=False)
    packed = [*(t.to(weight.device) for t in tile_major(*kernel_layout(q, zeros, scales, torch.bfloat16))), n]
    stored = [[t.clone() for t in packed[:3]] + [n] for _ in range(copies)]
    want = F.linear(x.float(), dequantize(q, zeros, scales, groups).to(weight.device))
    got = int4_linear(x, *packed).float()
    floor_us = (n * k // 2 + 3 * n * (k // INT4_GROUP)) / (bandwidth * 1e12) * 1e6
    figures = {"int4_max_rel_err": ((got - want).abs().max() / want.abs().max()).item(),
               "int4_us": per_call_us(lambda i: int4_linear(x, *stored[i]), copies), "int4_floor_us": floor_us,
               f"rows_{ROWS}_int4_us": per_call_us(lambda i: int4_linear(rows, *stored[i]), copies)}
    figures["int4_vs_floor"] = figures["int4_us"] / floor_us
    chosen = int4.GEMM_TILE
    for tile in INT4_GEMM_TILES if sweep else ():
        int4.GEMM_TILE = tile
        figures["int4_gemm_{}_us".format("x".join(map(str, tile)))] = per_call_us(
            lambda i: int4_linear(rows, *stored[i]), copies)
    int4.GEMM_TILE = chosen
    return figures


def random_int4_model(path: str, dtype: torch.dtype | None = None, device: torch.device | str = "cpu",
                      context_window: int | None = None, quantization: str = "none", int4_kernels: bool = True) -> Any:
    """gpu_families.random_model with every decoder projection in the INT4 form an AWQ checkpoint is kept in on CUDA
    (int4_checkpoint.to_int4_form, groups of INT4_GROUP), filled at random on the device."""
    from runtime.native.models.int4_checkpoint import tile_int4, to_int4_form
    from runtime.native.models.linear import Linear

    model = gf.random_model(path, dtype, device, context_window, quantization)
    gen = torch.Generator(device=device).manual_seed(1)
    for name, module in model.named_modules():
        if isinstance(module, Linear) and ".layers." in name and module.weight is not None:
            to_int4_form(module, max(1, module.in_features // INT4_GROUP))  # the smoke shapes: one group
            module.qweight.random_(-2**31, 2**31 - 1, generator=gen)
            module.qzeros.random_(0, 16, generator=gen)
            module.qscales.uniform_(0.002, 0.006, generator=gen)
            tile_int4(module)
    return model


def _int4_gemv_phase(record: Any, device: str, shapes: dict[str, tuple[int, int]], bandwidth: float,
                     smoke: bool) -> None:
    """The int4_gemv phase (module docstring); each shape's fastest GEMV for the int4 phase."""
    from benchmarks.gpu_int4_gemv import best_choices, gemv_figures
    from runtime.native.cuda import int4_gemv

    figures = record("int4_gemv", lambda: gemv_figures(device, shapes, bandwidth, 0 if smoke else MIN_BYTES, not smoke))
    int4_gemv.SHAPES.update(best_choices(figures, shapes))
    record("int4_gemv_shapes", lambda: {str(shape): choice for shape, choice in int4_gemv.SHAPES.items()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--skip", default="",
                        help="comma-separated phases to leave out: kernels, int4_gemv, bf16, fp8, int4, kv_fp8")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and loads: the code runs, nothing more")
    args = parser.parse_args(argv)
    import runtime.native.core_loader

    runtime.native.core_loader.load_model = gf.random_model  # random weights at the 8B shape, no checkpoint on disk
    model_type, shape = (gf.SMOKE_SHAPES if args.smoke else gf.SHAPES)["llama-3.1-8b"]
    if args.smoke:  # one layer: on the CPU each GEMV is a run of Triton's interpreter, each layer the same code
        shape = {**shape, "num_hidden_layers": 1}
    sizes = gf.SMOKE_SIZES if args.smoke else dict(prompt=gf.PROMPT, output=gf.OUTPUT, batch=gf.BATCH)
    skip = set(filter(None, args.skip.split(",")))
    phases = gf.Phases(args.out / "gpu_quant.json", {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device, "sizes": sizes,
        "date": time.strftime("%Y-%m-%d")}, printed=1200)
    results, record = phases.results, phases.record
    bandwidth = record("bandwidth_tb_s", lambda: bandwidth_tb_s(1 / 64 if args.smoke else 1.0, args.device))
    if "kernels" not in skip and isinstance(bandwidth, float):
        record("kernels", lambda: kernel_figures(args.device, SMOKE_SHAPES if args.smoke else SHAPES, bandwidth,
                                                 0 if args.smoke else MIN_BYTES, sweep=not args.smoke))
    if "int4_gemv" not in skip and isinstance(bandwidth, float):
        _int4_gemv_phase(record, args.device, SMOKE_SHAPES if args.smoke else SHAPES, bandwidth, args.smoke)
    folder = gf.write_config(args.out / "llama-3.1-8b", model_type, shape)
    for quantization in ("bf16", "fp8", "int4", "kv_fp8"):
        if quantization in skip:
            continue
        runtime.native.core_loader.load_model = random_int4_model if quantization == "int4" else gf.random_model
        options = {"quantization": "fp8" if quantization == "fp8" else "none",
                   "kv_cache_dtype": "fp8" if quantization == "kv_fp8" else "auto"}
        figures = record(quantization, lambda: asyncio.run(gf.engine_figures(folder, args.device, sizes, **options)))
        if "error" not in figures and isinstance(bandwidth, float):
            figures["floor_b1_ms"] = figures["floor_bytes"] / (bandwidth * 1e12) * 1e3
            figures["vs_floor"] = figures["decode_b1_itl_ms"] / figures["floor_b1_ms"]
    key = f"throughput_{sizes['batch']}_tok_s"
    for quantized in ("fp8", "int4", "kv_fp8"):
        if key in results.get(quantized, {}) and key in results.get("bf16", {}):
            results[f"{quantized}_vs_bf16"] = results[quantized][key] / results["bf16"][key]
            results[f"b1_{quantized}_vs_bf16"] = (results[quantized]["decode_b1_itl_ms"]
                                                  / results["bf16"]["decode_b1_itl_ms"])
    phases.write()
    return 1 if phases.failed else 0


if __name__ == "__main__":
    sys.exit(main())
