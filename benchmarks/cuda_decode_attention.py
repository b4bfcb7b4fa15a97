"""The Triton decode-attention kernel (runtime/native/cuda/paged_attention.py) at decode batch sizes, over its tile
settings, for Llama-3.2-1B's attention shape (32 query heads, 8 KV heads, head size 64, 16-token blocks; --head-dim 128:
Llama-3.1-8B's).

    python -m benchmarks.cuda_decode_attention            # on a GPU: one JSON line per (rows, context, setting)
    python -m benchmarks.cuda_decode_attention --smoke    # tiny, in Triton's interpreter without CUDA

Each figure is microseconds per call from a CUDA graph of `--calls` back-to-back calls, the way a decode graph
runs the kernel once per layer; a batch-1 step of the 1B model calls it 16 times. `tb_s`: the cached K and V
the call reads, over its time (against the H200's 4.1 TB/s of copy bandwidth).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os

import torch

from benchmarks.cpu_attention import decode_step
from benchmarks.cuda_timing import ms_per_call


def per_call_us(fn, calls: int) -> float:
    """Microseconds per call of fn(i) for i < calls, replayed from one CUDA graph of the `calls` calls (median of 5
    replays); NaN without CUDA (one plain call, fn(0): Triton's interpreter compiles nothing, and its figures
    would mean nothing)."""
    if not torch.cuda.is_available():
        fn(0)
        return float("nan")
    for i in range(calls):
        fn(i)  # compile and allocate outside the graph
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for i in range(calls):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    return ms_per_call(graph.replay, rounds=5) * 1000 / calls


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,8,64")
    parser.add_argument("--contexts", default="129,256,1024")
    parser.add_argument("--block-n", default="32,64,128")
    parser.add_argument("--num-warps", default="2,4")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
    from runtime.native.cuda import paged_attention

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # the interpreter's bf16 dot products are wrong
    heads, kv_heads, head_dim = (32, 8, args.head_dim) if not args.smoke else (4, 2, 16)
    default = paged_attention.DECODE_BLOCK_N, paged_attention.DECODE_NUM_WARPS
    tiles = list(itertools.product(map(int, args.block_n.split(",")), map(int, args.num_warps.split(","))))
    try:
        for rows, context in itertools.product(map(int, args.rows.split(",")), map(int, args.contexts.split(","))):
            q, _, _, cache, meta = decode_step([context] * rows, heads, kv_heads, head_dim, dtype)
            q, cache = q.to(device), cache.to(device)
            for name in ("seq_lens", "block_tables"):
                setattr(meta, name, getattr(meta, name).to(device))
            paged_attention.DECODE_BLOCK_N, paged_attention.DECODE_NUM_WARPS = default  # the reference: shipped tile
            ref = paged_attention.decode_attention(q, cache, meta, head_dim**-0.5)
            for block_n, warps in tiles:
                paged_attention.DECODE_BLOCK_N, paged_attention.DECODE_NUM_WARPS = block_n, warps
                out = paged_attention.decode_attention(q, cache, meta, head_dim**-0.5)
                us = per_call_us(lambda _: paged_attention.decode_attention(q, cache, meta, head_dim**-0.5), args.calls)
                kv_bytes = 2 * rows * context * kv_heads * head_dim * cache.element_size()
                print(json.dumps({"rows": rows, "context": context, "block_n": block_n, "num_warps": warps,
                                  "us": round(us, 2), "tb_s": round(kv_bytes / us / 1e6, 2),
                                  "max_diff": float((out.float() - ref.float()).abs().max())}),
                      flush=True)
    finally:  # the shipped tile again: the test suite runs this in a process of its own tests
        paged_attention.DECODE_BLOCK_N, paged_attention.DECODE_NUM_WARPS = default


if __name__ == "__main__":
    main()
