"""The Triton prefill-attention kernel (runtime/native/cuda/paged_attention.py) on one long prompt, over its tile
settings (query rows a program, warps, pipeline stages), Llama-3.1-8B's and 3.2-1B's attention shapes (32 query heads,
8 KV heads, head size 128 or 64, 16-token blocks).

    python -m benchmarks.cuda_prefill_attention               # on a GPU: one JSON line per (head size, setting)
    python -m benchmarks.cuda_prefill_attention --smoke       # tiny, in Triton's interpreter without CUDA

Each line: microseconds a call (a CUDA graph of --calls calls, as benchmarks/cuda_decode_attention.py times them),
TFLOP/s of causal attention (2 x 2 x heads x head size x tokens^2 / 2), and `same_bits_as_decode`: whether sampled
rows equal, bit for bit, the same rows decoded alone by the decode kernel (what keeps greedy speculation equal to
plain decoding; a setting that breaks it cannot be the default).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os

import torch

from benchmarks.cpu_attention import decode_step
from benchmarks.cuda_decode_attention import per_call_us


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--head-dims", default="128,64")
    parser.add_argument("--block-m", default="64,128")
    parser.add_argument("--num-warps", default="4,8")
    parser.add_argument("--num-stages", default="2,3,4")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
    from runtime.native.attention_metadata import AttentionMetadata
    from runtime.native.cuda import paged_attention as pa

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tokens = 40 if args.smoke else args.tokens
    heads, kv_heads = (32, 8) if not args.smoke else (4, 2)
    shipped = pa.PREFILL_TILE, pa.PREFILL_TILES_16BIT
    try:
        for head_dim in [16] if args.smoke else map(int, args.head_dims.split(",")):
            # the prompt's keys are in the cache already (the prefill kernel reads them from there after the store)
            _, _, _, cache, decode_meta = decode_step([tokens], heads, kv_heads, head_dim, dtype)
            cache = cache.to(device)
            table = decode_meta.block_tables.to(device)
            q = torch.randn(tokens, heads, head_dim, dtype=dtype, device=device)
            meta = AttentionMetadata(
                query_start_loc=torch.tensor([0, tokens], dtype=torch.int32, device=device),
                context_lens=torch.zeros(1, dtype=torch.int32, device=device),
                seq_lens=torch.tensor([tokens], dtype=torch.int32, device=device), block_tables=table,
                slot_mapping=torch.zeros(tokens, dtype=torch.int64, device=device), block_size=16, max_query_len=tokens,
                max_seq_len=tokens, query_lens_host=[tokens], seq_lens_host=[tokens])
            rows = sorted({0, tokens // 3, tokens // 2 + 1, tokens - 1})
            alone = {r: decode_meta.__class__(
                query_start_loc=torch.tensor([0, 1], dtype=torch.int32, device=device),
                context_lens=torch.tensor([r], dtype=torch.int32, device=device),
                seq_lens=torch.tensor([r + 1], dtype=torch.int32, device=device), block_tables=table,
                slot_mapping=torch.zeros(1, dtype=torch.int64, device=device), block_size=16, max_query_len=1,
                max_seq_len=r + 1, query_lens_host=[1], seq_lens_host=[r + 1]) for r in rows}
            decoded = {r: pa.decode_attention(q[r: r + 1], cache, m, head_dim**-0.5) for r, m in alone.items()}
            flops = 2 * 2 * heads * head_dim * tokens * tokens / 2
            for block_m, warps, stages in itertools.product(*(map(int, a.split(",")) for a in (
                    args.block_m, args.num_warps, args.num_stages))):
                pa.PREFILL_TILE = tile = pa.PrefillTile(block_m, warps, stages)  # every dtype and head size gets it
                pa.PREFILL_TILES_16BIT = {head_dim: tile}
                meta.derived.clear()  # the query tiles' map is cached per metadata, for one BLOCK_M
                try:
                    out = pa.prefill_attention(q, cache, meta, head_dim**-0.5)
                    us = per_call_us(lambda _: pa.prefill_attention(q, cache, meta, head_dim**-0.5), args.calls)
                except Exception as exc:  # noqa: BLE001 - a setting that does not compile (shared memory) is reported
                    print(json.dumps({"head_dim": head_dim, "block_m": block_m, "num_warps": warps,
                                      "num_stages": stages, "error": repr(exc)[:200]}), flush=True)
                    continue
                same = all(torch.equal(out[r: r + 1], decoded[r]) for r in rows)
                print(json.dumps({"head_dim": head_dim, "block_m": block_m, "num_warps": warps, "num_stages": stages,
                                  "us": round(us, 2), "tflops": round(flops / us / 1e6, 1),
                                  "same_bits_as_decode": same}), flush=True)
    finally:  # the shipped tiles again: the test suite runs this in a process of its own tests
        pa.PREFILL_TILE, pa.PREFILL_TILES_16BIT = shipped


if __name__ == "__main__":
    main()
