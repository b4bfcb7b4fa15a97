"""Projections of a decode step (few rows) on CUDA: cuBLAS (torch's default library, and cuBLASLt) against the
Triton kernel of runtime/cuda/skinny_linear.py over a grid of its tile settings, for Llama-3.2-1B's shapes.

    python -m benchmarks.skinny_gemm                 # on a GPU: JSON lines, one per (shape, rows, contender)
    python -m benchmarks.skinny_gemm --smoke         # tiny shapes, one setting (Triton's interpreter without CUDA)

Each figure is microseconds per call from a CUDA graph of `--calls` back-to-back calls (as in a decode graph,
without launch overhead), with the achieved weight bandwidth; the memory-bandwidth floor of the same bytes at
the device-to-device copy rate is printed first.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os

import torch

SHAPES = {"qkv": (2048, 3072), "o_proj": (2048, 2048), "gate_up": (2048, 16384), "down": (8192, 2048),
          "lm_head": (2048, 128256)}
SMOKE_SHAPES = {"tiny": (64, 48)}
GRID = {"block_n": (16, 32, 64), "block_k": (128, 256, 512), "num_warps": (4, 8), "num_stages": (2, 3, 5)}


def per_call_us(fn, calls: int) -> float:
    """Microseconds per call of `fn`, replayed from a CUDA graph of `calls` calls (median of 5 replays)."""
    if not torch.cuda.is_available():
        fn()
        return float("nan")
    fn()  # compile / pick kernels outside the graph
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return sorted(times)[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,8", help="comma list of M")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--dtype", default="bfloat16", help="bfloat16 | float16 | float32 (the smoke run without CUDA: "
                        "float32, as Triton's interpreter gets bf16 dot products wrong)")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
    import triton

    from runtime.cuda.skinny_linear import skinny_linear

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, args.dtype if device == "cuda" else "float32")
    shapes, grid = (SMOKE_SHAPES, {k: v[:1] for k, v in GRID.items()}) if args.smoke else (SHAPES, GRID)
    copy_tb_s = float("nan")
    if device == "cuda":
        buf = torch.empty(2**28, dtype=torch.uint8, device=device)
        copy_tb_s = 2 * buf.numel() / per_call_us(lambda: buf.clone(), 5) / 1e6
        print(json.dumps({"copy_tb_s": round(copy_tb_s, 2)}), flush=True)
    for (name, (k, n)), rows in itertools.product(shapes.items(), map(int, args.rows.split(","))):
        x = torch.randn(rows, k, device=device).to(dtype)
        w = (torch.randn(n, k, device=device) * k**-0.5).to(dtype)
        ref = torch.nn.functional.linear(x.float(), w.float())
        weight_bytes = w.numel() * w.element_size()

        def report(contender: str, us: float, out: torch.Tensor) -> None:
            err = ((out.float() - ref).norm() / ref.norm()).item()
            print(json.dumps({"shape": name, "k": k, "n": n, "rows": rows, "contender": contender,
                              "us": round(us, 2), "tb_s": round(weight_bytes / us / 1e6, 2),
                              "floor_us": round(weight_bytes / copy_tb_s / 1e6, 2), "rel_err": round(err, 5)}),
                  flush=True)

        if device == "cuda":
            for library in ("cublas", "cublaslt"):
                torch.backends.cuda.preferred_blas_library(library)
                report(library, per_call_us(lambda: torch.nn.functional.linear(x, w), args.calls),
                       torch.nn.functional.linear(x, w))
            torch.backends.cuda.preferred_blas_library("cublas")
        for values in itertools.product(*grid.values()):
            setting = dict(zip(grid, values))
            try:
                us = per_call_us(lambda: skinny_linear(x, w, **setting), args.calls)
            except triton.runtime.errors.OutOfResources:  # tiles past the shared memory at this many stages
                continue
            report("triton " + " ".join(f"{key}={value}" for key, value in setting.items()), us,
                   skinny_linear(x, w, **setting))


if __name__ == "__main__":
    main()
