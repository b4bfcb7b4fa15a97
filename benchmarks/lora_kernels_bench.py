"""GPU micro-benchmark of one decode step's LoRA work, per implementation, inside a CUDA graph.

    python -m benchmarks.lora_kernels_bench            # CUDA
    TRITON_INTERPRET=1 python -m benchmarks.lora_kernels_bench --device cpu --smoke   # the code, tiny, on the CPU

For the Llama-3.2-1B shapes (16 layers x the four adaptable Linears qkv, o, gate_up, down), 8 slots,
every token on slot t % 8, rank-8 adapters in slots of rank `cap`, it captures the projections of all
64 Linears with their LoRA updates in one graph and times its replays, against the base matmuls
alone: the difference is what LoRA adds to a graphed decode step, which issue 6 allows to be 0.3 x
the base step (~0.36 ms on the H100).

Implementations (each includes the base matmul):
  folded       what runs: one matmul over [W; A_all] (runtime/native/lora/slots.py), then the Triton expand
               (runtime/native/cuda/lora_kernels.py)
  gemm+expand  x W^T, x A_all^T (two cuBLAS matmuls), then an expand like the above reading h_all
  dense        x W^T, x A_all^T, one-hot mask, y.addmm_(h, B_all): the CPU product

--smoke: one layer of tiny Linears, one token count and cap (tests/benchmarks runs it on the CPU, in Triton's
interpreter, where the variants run eagerly: CUDA graphs need CUDA; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

import torch.nn.functional as F

from benchmarks.cuda_timing import ms_per_call
from runtime.native.cuda.lora_kernels import lora_expand

LINEARS = {"qkv": (2048, 3072, 3), "o": (2048, 2048, 1), "gate_up": (2048, 16384, 2), "down": (8192, 2048, 1)}
LAYERS, SLOTS, RANK = 16, 8, 8
SMOKE_LINEARS = {"qkv": (64, 96, 3), "o": (64, 64, 1), "gate_up": (64, 256, 2), "down": (128, 64, 1)}


@triton.jit
def _expand_from_all_slots(y_ptr, b_ptr, slots_ptr, ranks_ptr, h_ptr, N, S, stride_yt, stride_ht, stride_br,
                           stride_bs, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    """y[t] += h_all[t, r * S + slot] B[r, slot] for the token's slot (h_all = x @ A_all^T, every slot)."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + t)
    if slot < 0:
        return
    offs_r = tl.arange(0, BLOCK_R)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    r_mask = offs_r < tl.load(ranks_ptr + slot)
    n_mask = offs_n < N
    h = tl.load(h_ptr + t * stride_ht + offs_r * S + slot, mask=r_mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + slot * stride_bs + offs_r[:, None] * stride_br + offs_n[None, :],
                mask=r_mask[:, None] & n_mask[None, :], other=0.0).to(tl.float32)
    y_at = y_ptr + t * stride_yt + offs_n
    y = tl.load(y_at, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(y_at, (y + tl.sum(h[:, None] * b, axis=0)).to(y_ptr.dtype.element_ty), mask=n_mask)


def gemm_expand(x, y, a, b, slots, ranks, block_n=128, warps=4):
    cap, s, k = a.shape
    h = x @ a.reshape(cap * s, k).T  # [T, cap * S], column r * S + slot
    n = y.shape[1]
    block_r = triton.next_power_of_2(cap)
    _expand_from_all_slots[(x.shape[0], triton.cdiv(n, block_n))](
        y, b, slots, ranks, h, n, s, y.stride(0), h.stride(0), b.stride(0), b.stride(1),
        BLOCK_R=block_r, BLOCK_N=block_n, num_warps=warps)
    return y


def dense(x, y, a, b, onehot):
    cap, s, k = a.shape
    h = x @ a.reshape(cap * s, k).T
    h = (h.view(-1, cap, s) * onehot[:, None, :]).view(-1, cap * s)
    return y.addmm_(h, b.reshape(cap * s, -1))


def build(tokens: int, cap_rank: int, dtype: torch.dtype, device: str = "cuda", linears: dict = LINEARS,
          num_layers: int = LAYERS):
    """Per Linear: x, [W; A_all] with A_all = rank-major [cap * S, in] (rank-8 adapters), B, ranks."""
    g = torch.Generator(device=device).manual_seed(0)
    layers = []
    for _ in range(num_layers):
        for k, n, parts in linears.values():
            cap = cap_rank * parts
            used = RANK * parts
            stacked = torch.zeros(n + cap * SLOTS, k, device=device, dtype=dtype)
            stacked[:n] = torch.randn(n, k, device=device, generator=g, dtype=dtype) * 0.01
            stacked[n : n + used * SLOTS] = torch.randn(used * SLOTS, k, device=device, generator=g, dtype=dtype) * 0.01
            b = torch.zeros(cap, SLOTS, n, device=device, dtype=dtype)
            b[:used] = torch.randn(used, SLOTS, n, device=device, generator=g, dtype=dtype) * 0.01
            ranks = torch.full((SLOTS,), used, dtype=torch.int32, device=device)
            x = torch.randn(tokens, k, device=device, generator=g, dtype=dtype)
            matmul_rank = min(1 << (used - 1).bit_length(), cap)
            layers.append((x, stacked, n, matmul_rank, b, ranks))
    slots = torch.arange(tokens, device=device) % SLOTS
    onehot = torch.nn.functional.one_hot(slots, SLOTS).to(dtype)
    return layers, slots, onehot


def time_graph(fn, iters: int = 50, device: str = "cuda") -> float:
    """Median-free mean of `iters` replays (events around the loop), microseconds per replay. Off CUDA
    (--smoke on the CPU): one eager call of `fn` (Triton's interpreter compiles nothing; its figures mean nothing)."""
    if device != "cuda":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    return ms_per_call(graph.replay, iters, rounds=5) * 1e3


def time_variants(tokens: int, cap: int, dtype: torch.dtype, device: str = "cuda", smoke: bool = False) -> list[dict]:
    layers, slots, onehot = build(tokens, cap, dtype, device, *((SMOKE_LINEARS, 1) if smoke else (LINEARS, LAYERS)))

    def folded(x, stacked, n, r, b, ranks):
        return lora_expand(F.linear(x, stacked[: n + r * SLOTS]), b, slots, ranks)

    def separate(x, stacked, n, r, b, ranks, block_n=128, warps=1):
        y = F.linear(x, stacked[:n])
        a = stacked[n:].view(-1, SLOTS, x.shape[1])
        return gemm_expand(x, y, a, b, slots, ranks, block_n, warps)

    def dense_all(x, stacked, n, r, b, ranks):
        return dense(x, F.linear(x, stacked[:n]), stacked[n:].view(-1, SLOTS, x.shape[1]), b, onehot)

    variants = {
        "base matmuls": lambda: [F.linear(x, stacked[:n]) for x, stacked, n, *_ in layers],
        "folded": lambda: [folded(*layer) for layer in layers],
        "gemm+expand": lambda: [separate(*layer) for layer in layers],
        "dense": lambda: [dense_all(*layer) for layer in layers],
    }
    rows = []
    base = None
    for name, fn in variants.items():
        us = time_graph(fn, device=device)
        base = base or us
        rows.append({"tokens": tokens, "cap": cap, "variant": name, "us": us, "ratio_to_base": us / base})
        print(f"tokens {tokens:>3} cap {cap:>3}  {name:<14} {us:9.1f} us  {us / base:5.2f}x", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, nargs="+", default=[8, 32])
    p.add_argument("--caps", type=int, nargs="+", default=[8, 64], help="slot capacity per part (max_lora_rank)")
    p.add_argument("--device", default="cuda", help="cuda, or cpu (under TRITON_INTERPRET=1)")
    p.add_argument("--smoke", action="store_true", help="tiny Linears, one layer (see above)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    rows = []
    for tokens in args.tokens:
        for cap in args.caps:
            rows += time_variants(tokens, cap, torch.bfloat16, args.device, args.smoke)
            torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
