"""The INT4 GEMV (runtime/native/cuda/int4_gemv.py) at a few tiles per projection of Llama-3.1-8B, each against its
weight-bytes floor (half a byte a weight, 3 bytes a group's zero point and scale), launched as the engine's graphed
step launches them (programmatic dependent launches where the GPU has them, one CUDA graph of a chain of calls over
weight copies that do not fit in the L2). benchmarks/gpu_quant.py's `int4_gemv` phase; the fastest tile of each shape
becomes int4_gemv.SHAPES for its INT4 engine phase.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.cuda_decode_attention import per_call_us

GROUP = 128
# (BLOCK_N, WORDS, num_warps, AHEAD, SPLIT, PAIRS); SPLIT 0: int4_gemv.AUTO_PROGRAMS programs a multiprocessor, 1: no
# split-K; PAIRS 0: a float32 FFMA a weight, 1 / 2: two weights an instruction in bf16x2, summed in 16 bits over 1 / 2
# packed words (int4_gemv's module docstring)
TILES = [(128, 16, 4, 1, 0, 0), (64, 16, 4, 1, 0, 0), (64, 16, 4, 2, 0, 0),
         (128, 16, 4, 1, 0, 1), (64, 16, 4, 1, 0, 1),
         (128, 16, 4, 1, 0, 2), (64, 16, 4, 1, 0, 2), (128, 16, 4, 2, 0, 2), (256, 16, 8, 1, 0, 2), (256, 16, 4, 1, 0, 2)]


def _random_int4(n: int, k: int, device: str, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Random packed words, zero points and bf16 scales as loaded (int4.py's output-major form), groups of GROUP."""
    qweight = torch.randint(-2**31, 2**31 - 1, (n, k // 8), dtype=torch.int32, generator=gen).to(device)
    zeros = torch.randint(0, 16, (n, k // GROUP), dtype=torch.uint8, generator=gen).to(device)
    scales = (torch.rand(n, k // GROUP, generator=gen) * 0.004 + 0.002).to(device, torch.bfloat16)
    return qweight, zeros, scales


def _reference(x: torch.Tensor, qweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x (float32) times the float32 dequantized weight (the loader's unpacking and dequantization, on the CPU)."""
    from runtime.native.models.int4_checkpoint import dequantize, unpack_int4

    q = unpack_int4(qweight.cpu(), 1).t()  # [in, out], as the loader's unpacked values
    weight = dequantize(q, zeros.cpu().t().int(), scales.cpu().t(), torch.arange(q.shape[0]) // GROUP)
    return F.linear(x.float(), weight.to(x.device))


def gemv_figures(device: str, shapes: dict[str, tuple[int, int]], bandwidth: float, min_bytes: int,
                 sweep: bool = True) -> dict[str, Any]:
    """Per shape: each tile's us, its ratio to the floor and its error against the reference; `best`, the fastest
    of those within bf16 rounding. Without `sweep`, the first tile only (a smoke run)."""
    from runtime.native.cuda import pdl
    from runtime.native.cuda.int4 import tile_major
    from runtime.native.cuda.int4_gemv import int4_gemv

    gen = torch.Generator().manual_seed(0)
    res: dict[str, Any] = {}
    for name, (n, k) in shapes.items():
        loaded = _random_int4(n, k, device, gen)
        copies = max(2, -(-min_bytes // (n * k // 2)))
        stored = [tile_major(*loaded) for _ in range(copies)]
        x = torch.randn(1, k, generator=gen).to(device, torch.bfloat16)
        want = _reference(x, *loaded)
        floor_us = (n * k // 2 + 3 * n * (k // GROUP)) / (bandwidth * 1e12) * 1e6
        figures: dict[str, Any] = {"floor_us": floor_us}
        for tile in TILES if sweep else TILES[:1]:
            got = int4_gemv(x, *stored[0], n, tile=tile, pdl=pdl.ENABLED).float()
            us = per_call_us(lambda i: int4_gemv(x, *stored[i], n, tile=tile, pdl=pdl.ENABLED), copies)
            error = ((got - want).abs().max() / want.abs().max()).item()
            figures["x".join(map(str, tile))] = {"us": us, "vs_floor": us / floor_us, "max_rel_err": error}
        timed = {key: f for key, f in figures.items() if isinstance(f, dict) and f["max_rel_err"] < 1e-2}
        if timed and torch.cuda.is_available():
            figures["best"] = min(timed, key=lambda key: timed[key]["us"])
        res[name] = figures
    _print_table(res)
    return res


def best_choices(figures: dict[str, Any], shapes: dict[str, tuple[int, int]]) -> dict[tuple[int, int], Any]:
    """int4_gemv.SHAPES' entries from gemv_figures' `best` of each shape."""
    return {shape: tuple(int(v) for v in best.split("x")) for name, shape in shapes.items()
            if (best := figures.get(name, {}).get("best"))}


def _print_table(res: dict[str, Any]) -> None:
    keys = sorted({key for figures in res.values() for key, f in figures.items() if isinstance(f, dict)})
    print("| tile (BLOCK_N x WORDS x warps x AHEAD x SPLIT x PAIRS) | " + " | ".join(res) + " |")
    print("|---|" + "---|" * len(res))
    print("| floor us | " + " | ".join(f"{f['floor_us']:.2f}" for f in res.values()) + " |")
    for key in keys:
        cells = [f"{f[key]['us']:.2f} ({f[key]['vs_floor']:.2f}x)" if key in f else "-" for f in res.values()]
        print(f"| {key} | " + " | ".join(cells) + " |")
    print("| best | " + " | ".join(str(f.get("best")) for f in res.values()) + " |", flush=True)
