"""Large-batch GEMMs of the Llama-3.1-8B shape on one GPU (issue 48): what cuBLAS reaches per projection and row
count, against the bf16 FLOP peak, and what the alternatives reach on the same operands.

    python -m benchmarks.gemm_shapes                  # on a GPU: one JSON line per (projection, rows, variant)
    python -m benchmarks.gemm_shapes --smoke          # tiny shapes on the CPU, seconds: the code runs

Variants: `linear` (F.linear, what the engine runs), `halves` (gate/up as two products of half the columns, for
the wave count), `autotuned` (torch.compile max-autotune of the same F.linear: Inductor's Triton GEMM templates
against cuBLAS, the faster one kept; --autotune-shapes only, it compiles for a minute). Each figure: microseconds
a call (median of 5 timings of 20 calls), TFLOP/s and its share of PEAK_TFLOPS.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from benchmarks.cuda_timing import ms_per_call

PEAK_TFLOPS = 790.0
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
SMOKE_SHAPES = {"qkv": (96, 64), "o": (64, 64), "gate_up": (256, 64), "down": (64, 128)}


def per_call_us(fn, device: str, calls: int = 20) -> float:
    fn()
    if device != "cuda":
        return float("nan")
    return ms_per_call(fn, calls, rounds=5) * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="256,1024,4096")
    parser.add_argument("--autotune-shapes", default="gate_up@256,down@256", help="projection@rows pairs")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    rows = [8] if args.smoke else [int(r) for r in args.rows.split(",")]
    autotune = set(args.autotune_shapes.split(",")) if args.autotune_shapes else set()
    for name, (n, k) in shapes.items():
        w = torch.randn(n, k, dtype=dtype, device=device) * 0.02
        for m in rows:
            x = torch.randn(m, k, dtype=dtype, device=device)
            variants = {"linear": lambda: F.linear(x, w)}
            if name == "gate_up":
                gate, up = w[: n // 2], w[n // 2:]
                variants["halves"] = lambda: (F.linear(x, gate), F.linear(x, up))
            if f"{name}@{m}" in autotune and device == "cuda":
                compiled = torch.compile(lambda a, b: F.linear(a, b), mode="max-autotune-no-cudagraphs", dynamic=False)
                variants["autotuned"] = lambda: compiled(x, w)
            for variant, fn in variants.items():
                us = per_call_us(fn, device)
                tflops = 2 * m * n * k / us / 1e6
                print(json.dumps({"projection": name, "rows": m, "variant": variant, "us": round(us, 2),
                                  "tflops": round(tflops, 1), "of_peak": round(tflops / PEAK_TFLOPS, 3)}), flush=True)


if __name__ == "__main__":
    main()
