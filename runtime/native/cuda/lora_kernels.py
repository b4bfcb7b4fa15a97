"""Batched LoRA on CUDA at decode sizes: the expand half, y[t] = x W^T + B[slot_t] h[t], in one kernel.

The shrink half costs no launch: every slot's A sits under the base weight (runtime/native/lora/slots.py),
so the Linear's one matmul x [W; A_all]^T yields `y_ext` = [x W^T | h_all], with h_all[t, r * S + s]
= A[r, s] x[t] for every slot s, already rounded to the activation dtype as the eager x @ A^T is.
This kernel, one program per (token, block of outputs), reads the token's own slot's h columns and
B[slot] rows (as punica's BGMV gathers them), adds h B[slot] to the base output in float32 and
writes the sum, rounded once, into a new contiguous [T, out] tensor. Tokens of slot -1 (base model)
copy their base output. A slot's rank comes from `slot_ranks` on the device and only rank rows in
use are loaded; launch shapes depend only on (tokens, out), with no host sync: a CUDA graph replays
it whatever adapters the slots hold by then. Measured alternatives: benchmarks/lora_kernels_bench.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 128  # outputs per program: many small programs beat few large ones at decode sizes (H100)


@triton.jit
def _expand_kernel(y_ext_ptr, out_ptr, b_ptr, slots_ptr, ranks_ptr, N, S, stride_et, stride_en, stride_ot,
                   stride_br, stride_bs, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    y = tl.load(y_ext_ptr + t * stride_et + offs_n * stride_en, mask=n_mask, other=0.0).to(tl.float32)
    slot = tl.load(slots_ptr + t)
    if slot >= 0:
        offs_r = tl.arange(0, BLOCK_R)
        r_mask = offs_r < tl.load(ranks_ptr + slot)  # masked lanes load nothing
        h = tl.load(y_ext_ptr + t * stride_et + (N + offs_r * S + slot) * stride_en, mask=r_mask,
                    other=0.0).to(tl.float32)
        b = tl.load(b_ptr + slot * stride_bs + offs_r[:, None] * stride_br + offs_n[None, :],
                    mask=r_mask[:, None] & n_mask[None, :], other=0.0).to(tl.float32)
        y += tl.sum(h[:, None] * b, axis=0)
    tl.store(out_ptr + t * stride_ot + offs_n, y.to(out_ptr.dtype.element_ty), mask=n_mask)


def lora_expand(y_ext: torch.Tensor, b: torch.Tensor, token_slots: torch.Tensor,
                slot_ranks: torch.Tensor) -> torch.Tensor:
    """y [T, out] = y_ext[:, :out] + h[t, r * S + s] B[r, s] over the token's slot s and its ranks r.

    y_ext [T, out + r_m * S] (any strides: a matmul may hand back a transposed layout) is
    x [W; A_all[:r_m]]^T; b [cap, S, out] (unit last stride); token_slots int64 [T] (-1: base model); slot_ranks int32 [S] (<= r_m for slots in use).
    """
    tokens = y_ext.shape[0]
    _, slots, n = b.shape
    assert b.stride(2) == 1 and token_slots.shape == (tokens,)
    assert slot_ranks.shape == (slots,) and slot_ranks.dtype == torch.int32 and y_ext.shape[1] >= n
    out = torch.empty((tokens, n), dtype=y_ext.dtype, device=y_ext.device)
    if tokens == 0:
        return out
    block_r = triton.next_power_of_2(max(1, (y_ext.shape[1] - n) // slots))  # the ranks y_ext holds
    _expand_kernel[(tokens, triton.cdiv(n, BLOCK_N))](
        y_ext, out, b, token_slots, slot_ranks, n, slots, y_ext.stride(0), y_ext.stride(1), out.stride(0),
        b.stride(0), b.stride(1),
        BLOCK_R=block_r, BLOCK_N=BLOCK_N, num_warps=max(1, min(8, block_r * BLOCK_N // 2048)),  # <= 64 values a thread
    )
    return out
