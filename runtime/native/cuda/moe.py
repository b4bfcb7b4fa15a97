"""Fused mixture-of-experts on CUDA (Triton): the experts' products of a step without a Python loop over experts.

`fused_experts(experts, x, weights, ids)` computes what runtime/native/models/moe.py's `Experts.forward` does:

- steps of more than a few (token, expert) pairs: the pairs are grouped by expert on the device (`align`: counts,
  runs and placement by atomic adds; no host sync, shapes fixed by the token count, so CUDA graphs capture it), each
  expert's run padded to BLOCK_M rows (GEMM_TILES: by the token count); then one grouped GEMM kernel over all blocks
  (each block reads its tokens' rows, gathered, and its expert's weight tiles), the gated activation, and a second
  grouped GEMM that multiplies by each pair's router weight; each token's sum over its k pairs is one reduction;
- steps of few pairs: a GEMV kernel whose programs each read one chosen expert's weight rows, so a step reads only
  the k chosen experts' weights, the same activation, and the same weighted sum. (A 16-bit model's batch-1 decode
  step runs its MoE layers through runtime/native/cuda/one_token_moe.py instead: router, routing and experts in four
  kernels.)

Results round to the activation dtype where the eager code does (after each product, and after weighting), with
float32 accumulation; float32 models use IEEE dot products.
"""

from __future__ import annotations

import functools
import types

import torch
import triton
import triton.language as tl

from runtime.native.models.moe import Experts

GEMV_MAX_PAIRS = 16  # steps of up to this many (token, expert) pairs take the GEMV kernel
GEMV_BLOCK_N, GEMV_BLOCK_K = 16, 128
# The grouped GEMMs' tiles by the step's token count, the first whose bound holds: (BLOCK_M rows (pairs) of a block,
# BLOCK_N, BLOCK_K, num_warps, num_stages). From vLLM's table for its own fused-MoE kernel (the same blocks of
# expert-sorted pairs) tuned on the H200 for 128 experts of 768, the Qwen3-30B-A3B shape
# (fused_moe/configs/E=128,N=768,device_name=NVIDIA_H200.json); decode batches give each expert few rows, prefill
# chunks hundreds. The tiles were 16 x 64 x 64 for every step before: 7.1k output tok/s at 256 x 128/128 on the H200.
GEMM_TILES: tuple[tuple[int, tuple[int, int, int, int, int]], ...] = (
    (40, (16, 64, 128, 4, 3)), (192, (16, 128, 128, 4, 2)), (384, (32, 256, 128, 4, 2)), (768, (64, 128, 64, 4, 3)),
    (1 << 62, (128, 256, 64, 8, 4)))
FLOAT32_MAX_TILE = (64, 64, 3)  # float32 (test models): BLOCK_N, BLOCK_K, num_stages at most (shared memory)
SHARED_MEMORY_SLACK = 16 * 1024  # what a kernel may need beyond its pipelined tiles (epilogue, barriers)


@triton.jit
def _grouped_gemm_kernel(
    a_ptr, w_ptr, bias_ptr, out_ptr, sorted_ptr, block_expert_ptr, pair_weight_ptr, num_sorted_ptr, num_pairs,
    N, K, stride_a, stride_we, stride_wn, stride_o,
    TOP_K: tl.constexpr, ROW_PER_TOKEN: tl.constexpr, WEIGHTED: tl.constexpr, BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):
    """out[pair] = (a[row of pair] @ W[expert]^T + bias[expert]) (* pair weight) for the BLOCK_M sorted pairs of
    this block, all of one expert; a's row is the pair's token (ROW_PER_TOKEN) or the pair itself."""
    block = tl.program_id(0)
    if block * BLOCK_M < tl.load(num_sorted_ptr):
        expert = tl.load(block_expert_ptr + block).to(tl.int64)
        pairs = tl.load(sorted_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
        valid = pairs < num_pairs  # the padding of each expert's run holds num_pairs
        rows = (pairs // TOP_K if ROW_PER_TOKEN else pairs).to(tl.int64)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        n_mask = offs_n < N
        w_base = w_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k in range(0, K, BLOCK_K):
            cols = k + offs_k
            a = tl.load(a_ptr + rows[:, None] * stride_a + cols[None, :], mask=valid[:, None] & (cols < K)[None, :],
                        other=0.0)
            w = tl.load(w_base + cols[:, None], mask=(cols < K)[:, None] & n_mask[None, :], other=0.0)
            acc += tl.dot(a, w, input_precision=PRECISION)
        dtype = out_ptr.dtype.element_ty
        if BIAS:  # inside the product's rounding, as F.linear adds it
            acc += tl.load(bias_ptr + expert * N + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        if WEIGHTED:
            acc = acc.to(dtype).to(tl.float32) * tl.load(pair_weight_ptr + pairs, mask=valid, other=0.0)[:, None]
        tl.store(out_ptr + pairs.to(tl.int64)[:, None] * stride_o + offs_n[None, :], acc.to(dtype),
                 mask=valid[:, None] & n_mask[None, :])


@triton.jit
def _expert_gemv_kernel(
    a_ptr, w_ptr, bias_ptr, out_ptr, ids_ptr, pair_weight_ptr, N, K, stride_a, stride_we, stride_wn, stride_o,
    TOP_K: tl.constexpr, ROW_PER_TOKEN: tl.constexpr, WEIGHTED: tl.constexpr, BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One (pair, BLOCK_N output rows) per program: out[pair, rows] = W[expert of pair, rows] . a[row of pair] (+ bias)
    (* pair weight). Only the chosen experts' weights are read."""
    pair = tl.program_id(0)
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    row = pair // TOP_K if ROW_PER_TOKEN else pair
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    w_rows = w_ptr + expert * stride_we + offs_n[:, None].to(tl.int64) * stride_wn
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k in range(0, K, BLOCK_K):
        cols = k + offs_k
        x = tl.load(a_ptr + row * stride_a + cols, mask=cols < K, other=0.0).to(tl.float32)
        w = tl.load(w_rows + cols[None, :], mask=n_mask[:, None] & (cols < K)[None, :], other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    out = tl.sum(acc, axis=1)
    dtype = out_ptr.dtype.element_ty
    if BIAS:  # inside the product's rounding, as F.linear adds it
        out += tl.load(bias_ptr + expert * N + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    if WEIGHTED:
        out = out.to(dtype).to(tl.float32) * tl.load(pair_weight_ptr + pair)
    tl.store(out_ptr + pair * stride_o + offs_n, out.to(dtype), mask=n_mask)


@triton.jit
def gated(gate, up, alpha, limit, dtype, CLAMPED: tl.constexpr):
    """act(gate, up) of float32 values already rounded to `dtype`, rounded as the eager ops: silu(gate) * up, or
    gpt-oss's clamped SwiGLU (runtime/native/models/moe.py)."""
    if CLAMPED:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        glu = (gate * (1.0 / (1.0 + tl.exp(-gate * alpha))).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        out = (up + 1.0).to(dtype).to(tl.float32) * glu
    else:
        out = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32) * up
    return out.to(dtype)


@triton.jit
def _gated_activation_kernel(x_ptr, out_ptr, I, alpha, limit, CLAMPED: tl.constexpr, BLOCK: tl.constexpr):
    """out[p] = act(x[p, :I], x[p, I:]) (`gated`)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < I
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(x_ptr + row * 2 * I + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * I + I + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * I + offs, gated(gate, up, alpha, limit, dtype, CLAMPED), mask=mask)


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, P, BLOCK: tl.constexpr):
    """counts[e] += the pairs of this block that go to expert e."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < P
    tl.atomic_add(counts_ptr + tl.load(ids_ptr + offs, mask=mask, other=0), 1, mask=mask)


@triton.jit
def _runs_kernel(counts_ptr, cursor_ptr, sorted_ptr, block_expert_ptr, num_sorted_ptr, P, capacity,
                 E: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK: tl.constexpr,
                 BLOCK_B: tl.constexpr):
    """One program: each expert's run (its count padded to BLOCK_M) in expert order, its start into `cursor`, the
    padded length, the expert of every BLOCK_M block (the last expert for blocks past the runs), and every slot of
    `sorted` set to padding (P) for _place_kernel to fill."""
    offs_e = tl.arange(0, BLOCK_E)
    real = offs_e < E
    padded = (tl.load(counts_ptr + offs_e, mask=real, other=0) + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    tl.store(cursor_ptr + offs_e, ends - padded, mask=real)
    tl.store(num_sorted_ptr, tl.sum(padded, axis=0))
    for b0 in range(0, capacity // BLOCK_M, BLOCK_B):
        blocks = b0 + tl.arange(0, BLOCK_B)
        ended = (ends[None, :] <= (blocks * BLOCK_M)[:, None]) & real[None, :]  # runs wholly before the block
        expert = tl.minimum(tl.sum(ended.to(tl.int32), axis=1), E - 1)
        tl.store(block_expert_ptr + blocks, expert, mask=blocks < capacity // BLOCK_M)
    for s0 in range(0, capacity, BLOCK):
        slots = s0 + tl.arange(0, BLOCK)
        tl.store(sorted_ptr + slots, tl.zeros([BLOCK], tl.int32) + P, mask=slots < capacity)


@triton.jit
def _place_kernel(ids_ptr, cursor_ptr, sorted_ptr, P, BLOCK: tl.constexpr):
    """Each pair of this block into the next free slot of its expert's run."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < P
    slot = tl.atomic_add(cursor_ptr + tl.load(ids_ptr + offs, mask=mask, other=0), 1, mask=mask)
    tl.store(sorted_ptr + slot, offs, mask=mask)


def align(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The step's (token, expert) pairs (pair p = token * k + j) sorted by expert, each expert's run padded to a
    multiple of `block_m` with the index `ids.numel()`: (sorted pairs [capacity], expert of each block
    [capacity / block_m], int32 [1] pairs' length with the padding). Capacity depends only on the shapes.

    Three kernels after a zeroed count (were 35 torch ops, a sort among them: 1.6k kernels in a 256-row decode step of
    Qwen3-30B-A3B): counts by atomic adds, the runs, then each pair placed by an atomic add on its run's cursor, so
    the order within a run varies from step to step; no result does (a GEMM row's products do not depend on the
    row's place in its block)."""
    pairs = ids.numel()
    flat = ids.reshape(-1)
    capacity = -(-(pairs + num_experts * (block_m - 1)) // block_m) * block_m
    counts = torch.zeros(2 * num_experts, dtype=torch.int32, device=ids.device)  # the counts, then the cursors
    sorted_pairs = torch.empty(capacity, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(capacity // block_m, dtype=torch.int32, device=ids.device)
    num_sorted = torch.empty(1, dtype=torch.int32, device=ids.device)
    block = 1024
    grid = (triton.cdiv(pairs, block),)
    _count_kernel[grid](flat, counts, pairs, BLOCK=block)
    _runs_kernel[(1,)](counts, counts[num_experts:], sorted_pairs, block_expert, num_sorted, pairs, capacity,
                       E=num_experts, BLOCK_E=triton.next_power_of_2(num_experts), BLOCK_M=block_m, BLOCK=block,
                       BLOCK_B=max(16, 8192 // triton.next_power_of_2(num_experts)))
    _place_kernel[grid](flat, counts[num_experts:], sorted_pairs, pairs, BLOCK=block)
    return sorted_pairs, block_expert, num_sorted


@functools.cache
def shared_memory_bytes(device_index: int) -> int:
    """The shared memory one program may use on a GPU (its opt-in limit: 227 KB on an H200, 99 KB on an L40S)."""
    return triton.runtime.driver.active.utils.get_device_properties(device_index)["max_shared_mem"]


def gemm_tile(tokens: int, dtype: torch.dtype, shared_memory: int | None = None) -> tuple[int, int, int, int, int]:
    """The grouped GEMMs' (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) for a step of `tokens`: GEMM_TILES',
    fitted (`fit_tile`)."""
    return fit_tile(next(tile for bound, tile in GEMM_TILES if tokens <= bound), dtype, shared_memory)


def fit_tile(tile: tuple[int, int, int, int, int], dtype: torch.dtype,
             shared_memory: int | None) -> tuple[int, int, int, int, int]:
    """`tile` within FLOAT32_MAX_TILE for float32, and with fewer stages, then narrower, where its pipelined tiles
    would not fit `shared_memory` bytes (the H200's tiles on a smaller GPU); None: no limit (Triton's interpreter)."""
    block_m, block_n, block_k, warps, stages = tile
    if dtype == torch.float32:
        max_n, max_k, max_stages = FLOAT32_MAX_TILE
        block_n, block_k, stages = min(block_n, max_n), min(block_k, max_k), min(stages, max_stages)
    if shared_memory is not None:
        def needed() -> int:
            return stages * (block_m + block_n) * block_k * torch.finfo(dtype).bits // 8 + SHARED_MEMORY_SLACK

        while needed() > shared_memory and stages > 2:
            stages -= 1
        while needed() > shared_memory and block_n > 32:
            block_n //= 2
    return block_m, block_n, block_k, warps, stages


def _gemm(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, sorted_pairs: torch.Tensor,
          block_expert: torch.Tensor, num_sorted: torch.Tensor, pair_weights: torch.Tensor | None, pairs: int,
          top_k: int, per_token: bool, tile: tuple[int, int, int, int, int]) -> torch.Tensor:
    n, k = w.shape[1], w.shape[2]
    out = torch.empty((pairs, n), dtype=a.dtype, device=a.device)
    block_m, block_n, block_k, warps, stages = tile
    block_n = min(block_n, triton.next_power_of_2(max(n, 16)))
    block_k = min(block_k, triton.next_power_of_2(max(k, 16)))
    grid = (block_expert.shape[0], triton.cdiv(n, block_n))
    _grouped_gemm_kernel[grid](
        a, w, w if bias is None else bias, out, sorted_pairs, block_expert,
        out if pair_weights is None else pair_weights, num_sorted, pairs, n, k, a.stride(0), w.stride(0),
        w.stride(1), out.stride(0), TOP_K=top_k, ROW_PER_TOKEN=per_token, WEIGHTED=pair_weights is not None,
        BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        PRECISION="ieee" if a.dtype == torch.float32 else "tf32", num_warps=warps, num_stages=stages,
    )
    return out


def _gemv(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, ids: torch.Tensor,
          pair_weights: torch.Tensor | None, top_k: int, per_token: bool) -> torch.Tensor:
    pairs = ids.numel()
    n, k = w.shape[1], w.shape[2]
    out = torch.empty((pairs, n), dtype=a.dtype, device=a.device)
    _expert_gemv_kernel[(pairs, triton.cdiv(n, GEMV_BLOCK_N))](
        a, w, w if bias is None else bias, out, ids, out if pair_weights is None else pair_weights, n, k,
        a.stride(0), w.stride(0), w.stride(1), out.stride(0), TOP_K=top_k, ROW_PER_TOKEN=per_token,
        WEIGHTED=pair_weights is not None, BIAS=bias is not None, BLOCK_N=GEMV_BLOCK_N,
        BLOCK_K=min(GEMV_BLOCK_K, triton.next_power_of_2(k)),
    )
    return out


def gated_activation(gate_up: torch.Tensor, experts: Experts) -> torch.Tensor:
    """`Experts.activation` of gate_up [P, 2I] in one kernel."""
    pairs, width = gate_up.shape
    inter = width // 2
    out = torch.empty((pairs, inter), dtype=gate_up.dtype, device=gate_up.device)
    if pairs:
        block = min(1024, triton.next_power_of_2(inter))
        moe = experts.moe
        _gated_activation_kernel[(pairs, triton.cdiv(inter, block))](
            gate_up, out, inter, moe.alpha, moe.limit, CLAMPED=moe.activation == "swiglu_clamp", BLOCK=block)
    return out


def fused_experts(experts: Experts, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """`Experts.forward` on CUDA: x [T, H], float32 router weights and int expert ids [T, k] -> [T, H]."""
    tokens, top_k = ids.shape
    x = x.contiguous()
    pair_weights = weights.reshape(-1).float().contiguous()
    w13, w2, b13, b2 = experts.gate_up_proj, experts.down_proj, experts.gate_up_proj_bias, experts.down_proj_bias
    if ids.numel() <= GEMV_MAX_PAIRS:
        flat = ids.reshape(-1).contiguous()
        h = gated_activation(_gemv(x, w13, b13, flat, None, top_k, per_token=True), experts)
        y = _gemv(h, w2, b2, flat, pair_weights, top_k, per_token=False)
    else:
        tile = gemm_tile(tokens, x.dtype, shared_memory_bytes(x.device.index) if x.is_cuda else None)
        sorted_pairs, block_expert, num_sorted = align(ids, experts.moe.num_experts, tile[0])
        pairs = ids.numel()
        h = gated_activation(_gemm(x, w13, b13, sorted_pairs, block_expert, num_sorted, None, pairs, top_k,
                                   per_token=True, tile=tile), experts)
        y = _gemm(h, w2, b2, sorted_pairs, block_expert, num_sorted, pair_weights, pairs, top_k, per_token=False,
                  tile=tile)
    return y.view(tokens, top_k, -1).sum(dim=1)


def use_fused_experts(model: torch.nn.Module) -> int:
    """Route every `Experts` module of `model` through `fused_experts`; returns how many."""
    count = 0
    for module in model.modules():
        if isinstance(module, Experts):
            module.forward = types.MethodType(fused_experts, module)
            count += 1
    return count
