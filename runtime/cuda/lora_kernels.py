"""Batched LoRA on CUDA: y[t] += B[slot_t] (A[slot_t] x[t]) for every token, in two Triton kernels.

Why: the eager all-slots product (runtime/lora/apply.py) costs about four small kernels per adaptable
Linear and depends on Python-side state (the used rank, which tokens have an adapter), so it can
neither be cheap at decode sizes nor be replayed from a CUDA graph. Here each token gathers its own
slot's weights (as punica's BGMV):
- shrink, one program per (token, slice of `in`): partial h = A[slot] x over the slot's rank rows,
  read from the device (`slot_ranks`), so a graph replays right whatever the slots hold, and loads
  only the rows in use (a rank-8 adapter in slots sized for rank 64 costs rank-8 bytes). A decode step has
  only a few tokens, and one program per token would walk all of `in` alone; the slices spread that
  over about as many programs as the GPU has SMs. Partials go to an fp32 scratch [T, splits, BLOCK_R]
  (no atomics: the sum is deterministic);
- expand, one program per (token, block of outputs): h = the sum of the token's partials, rounded to
  x's dtype (the eager x @ A^T output's rounding), then y += h B[slot] accumulated in fp32 and rounded
  once to y's dtype (as addmm does).
Programs of tokens with slot -1 (base model) return at once: their rows of y are untouched. Launch
shapes depend only on (tokens, cap, in, out): no host sync, so a CUDA graph can capture the pair and
replay it with other slots in the static slot tensor. Layout (runtime/lora/slots.py): A [cap, S, in],
B [cap, S, out], rank-major, unit stride along in / out.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

TILE = 8192  # elements of one [BLOCK_R, BLOCK_K|N] weight tile: 64 fp32 registers a thread at 4 warps
MIN_PROGRAMS = 128  # shrink programs to aim for when tokens are few (an H100 has 132 SMs)


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, slots_ptr, ranks_ptr, h_ptr, K, K_PER_SPLIT, SPLITS, stride_xt, stride_xk,
                   stride_ar, stride_as, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    slot = tl.load(slots_ptr + t)
    if slot < 0:
        return
    offs_r = tl.arange(0, BLOCK_R)
    offs_k = tl.arange(0, BLOCK_K)
    r_mask = offs_r < tl.load(ranks_ptr + slot)  # masked lanes load nothing
    a_rows = a_ptr + slot * stride_as + offs_r[:, None] * stride_ar
    start = split * K_PER_SPLIT
    acc = tl.zeros([BLOCK_R], dtype=tl.float32)
    for k in range(0, K_PER_SPLIT, BLOCK_K):
        ks = start + k + offs_k
        k_mask = ks < K
        x = tl.load(x_ptr + t * stride_xt + ks * stride_xk, mask=k_mask, other=0.0).to(tl.float32)
        a = tl.load(a_rows + ks[None, :], mask=r_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(a * x[None, :], axis=1)
    tl.store(h_ptr + (t * SPLITS + split) * BLOCK_R + offs_r, acc)


@triton.jit
def _expand_kernel(y_ptr, b_ptr, slots_ptr, ranks_ptr, h_ptr, N, SPLITS, stride_yt, stride_yn, stride_br,
                   stride_bs, BLOCK_S: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
                   H_DTYPE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + t)
    if slot < 0:
        return
    offs_s = tl.arange(0, BLOCK_S)
    offs_r = tl.arange(0, BLOCK_R)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    r_mask = offs_r < tl.load(ranks_ptr + slot)
    n_mask = offs_n < N
    partials = tl.load(h_ptr + (t * SPLITS + offs_s[:, None]) * BLOCK_R + offs_r[None, :],
                       mask=(offs_s < SPLITS)[:, None] & r_mask[None, :], other=0.0)
    h = tl.sum(partials, axis=0).to(H_DTYPE).to(tl.float32)  # the eager x @ A^T rounds here
    b = tl.load(b_ptr + slot * stride_bs + offs_r[:, None] * stride_br + offs_n[None, :],
                mask=r_mask[:, None] & n_mask[None, :], other=0.0).to(tl.float32)
    delta = tl.sum(h[:, None] * b, axis=0)
    y_at = y_ptr + t * stride_yt + offs_n * stride_yn
    y = tl.load(y_at, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(y_at, (y + delta).to(y_ptr.dtype.element_ty), mask=n_mask)


_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def lora_shrink_expand(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                       token_slots: torch.Tensor, slot_ranks: torch.Tensor) -> torch.Tensor:
    """In place y[t] += B[s] (A[s] x[t]) with s = token_slots[t]; rows with s = -1 untouched; returns y.

    x [T, in] and y [T, out] with any strides, a [cap, S, in] and b [cap, S, out] with unit last
    stride, token_slots int64 [T] and slot_ranks int32 [S] (rank rows in use per slot, <= cap) on the
    same device.
    """
    tokens, k = x.shape
    n = y.shape[1]
    cap = a.shape[0]
    assert y.shape[0] == tokens and token_slots.shape == (tokens,) and a.shape[2] == k and b.shape[2] == n
    assert slot_ranks.shape == (a.shape[1],) and slot_ranks.dtype == torch.int32
    assert a.stride(2) == 1 and b.stride(2) == 1 and b.shape[:2] == a.shape[:2]
    if tokens == 0:
        return y
    block_r = triton.next_power_of_2(cap)
    block_k = max(16, min(1024, TILE // block_r, triton.next_power_of_2(k)))
    block_n = max(16, min(128, TILE // block_r, triton.next_power_of_2(n)))
    chunks = triton.cdiv(k, block_k)
    splits = max(1, min(chunks, MIN_PROGRAMS // tokens))
    k_per_split = triton.cdiv(chunks, splits) * block_k
    splits = triton.cdiv(k, k_per_split)  # no empty trailing split
    h = torch.empty((tokens, splits, block_r), dtype=torch.float32, device=x.device)
    # splits is a run-time argument: the graph buckets' token counts change it, and each value of a
    # constexpr would be one more compilation
    _shrink_kernel[(tokens, splits)](x, a, token_slots, slot_ranks, h, k, k_per_split, splits, x.stride(0),
                                     x.stride(1), a.stride(0), a.stride(1), BLOCK_R=block_r, BLOCK_K=block_k)
    _expand_kernel[(tokens, triton.cdiv(n, block_n))](y, b, token_slots, slot_ranks, h, n, splits, y.stride(0),
                                                       y.stride(1), b.stride(0), b.stride(1),
                                                       BLOCK_S=triton.next_power_of_2(splits), BLOCK_R=block_r,
                                                       BLOCK_N=block_n, H_DTYPE=_TL_DTYPES[x.dtype])
    return y
