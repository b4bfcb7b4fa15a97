"""A mixture-of-experts layer's MLP for one token (the batch-1 decode step) in four kernels.

`one_token_moe(moe, x, norm)` is `x + moe(norm(x))` (runtime/native/models/moe.py), for a 16-bit x [1, H]:

1. the router: runtime/native/cuda/gemv.py's GEMV with its RMSNorm prologue writes the E logits;
2. routing: one program picks the token's k experts from them (route's choice) and writes their ids and router
   weights, once, for the ~3,600 expert programs that follow (Qwen3-30B-A3B);
3. gate/up: program (j, tile) reads the j-th chosen expert's gate and up rows of the tile over RMSNorm(x) and writes
   their gated activation h[j, tile];
4. down: program (tile, j) reads its output rows of the j-th expert's down matrix, weights the product by the
   router weight and stores it; the last of a tile's k programs to arrive (an atomic counter) sums the k products
   in order and adds the residual x (runtime/native/cuda/arrivals.py's counters).

Why: the general path (runtime/native/cuda/moe.py's `fused_experts` after the eager router) took 12 kernels: an RMSNorm,
the router's matmul, a cast, softmax, top-k, sum and division, two GEMVs and the activation, the sum over k and
the residual add. A batch-1 step of Qwen3-30B-A3B (48 such layers) took 3.99 ms on the H200 against its 1.45 ms
floor (benchmarks/RESULTS.md, 2026-11-29). Here every expert product reads only the k chosen experts' weights
(3 x 768 x 2048 per expert there), spread over many programs: k x I / BLOCK_N for gate/up, H / BLOCK_N x k for
down. Every kernel is a programmatic dependent launch (runtime/native/cuda/pdl.py). On that H200 (graphed step,
CUDA events) this layer took the step to 2.554 ms (1.76x its floor; one MoE layer 32.1 us against its 18.1 us
floor) where the earlier designs measured: each expert program finding the top-k itself and a down program owning
output rows over all k experts in turn, 3.027 ms (42.0 us a layer); the routing done by the last of the router's
programs (an atomic counter) instead of a kernel of its own, 2.673 ms (34.5 us); the routing kernel with that
unsplit down, 2.677 ms (35.5 us): H / BLOCK_N programs, each with k dependent loads, are too few for the H200's
132 SMs at H = 2048.

Roundings follow the eager code: the logits and each product in the activations' dtype, the weighting in float32
then rounded, the sum over k in float32 then rounded, then the residual add; only the order of a dot product's sums
differs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runtime.native.cuda import pdl
from runtime.native.cuda.arrivals import arrived_last, counters
from runtime.native.cuda.gemv import gemv, input_rstd, input_tile, rstd_block
from runtime.native.cuda.moe import gated
from runtime.native.cuda.pdl import wait_for_previous_kernel
from runtime.native.models.moe import MoE
from runtime.native.models.norm import RMSNorm

# (BLOCK_N, BLOCK_K, num_warps): gate/up programs own BLOCK_N gate rows and their BLOCK_N up rows of one expert, down
# programs BLOCK_N output rows of one expert (I = 768 is one masked 1024-column step). H200, 2026-11-29
# (benchmarks/gpu_moe_profile.py, the whole layer): no alternative tile of either kernel was faster by more than
# the run's ~1 us noise (gate/up 31.9-34.2 us, down 32.1-34.0 us); the router's tile is gemv.py's TILES.
GATE_UP_TILE = (4, 1024, 4)
DOWN_TILE = (8, 1024, 4)

@triton.jit
def _route_kernel(logits_ptr, ids_ptr, weights_ptr, E: tl.constexpr, BLOCK_E: tl.constexpr, TOP_K: tl.constexpr,
                  BLOCK_TOPK: tl.constexpr, SOFTMAX_FIRST: tl.constexpr, RENORMALIZE: tl.constexpr,
                  PDL: tl.constexpr):
    """One token's experts as runtime/native/models/moe.py's `route` picks them from its E router logits: ids
    [BLOCK_TOPK] (int32) and weights [BLOCK_TOPK] (float32), slot j the j-th largest logit (ties: the lower id);
    slots from TOP_K on hold id 0 and weight 0. SOFTMAX_FIRST: softmax over all E, the chosen ones' probabilities
    (divided by their sum when RENORMALIZE); else the softmax of the chosen logits.

    Each pick is one max over int64 keys, the logit's bits ordered as the floats above the id reversed: one
    reduction where a max then the lowest id holding it took two."""
    wait_for_previous_kernel(PDL)  # the logits are the router's output
    offs = tl.arange(0, BLOCK_E)
    logits = tl.load(logits_ptr + offs, mask=offs < E, other=float("-inf")).to(tl.float32)
    bits = logits.to(tl.int32, bitcast=True)
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # negative floats' bits count down
    keys = (ordered.to(tl.int64) << 32) | (BLOCK_E - 1 - offs).to(tl.int64)
    slots = tl.arange(0, BLOCK_TOPK)
    ids = tl.zeros([BLOCK_TOPK], tl.int32)
    top = tl.full([BLOCK_TOPK], float("-inf"), tl.float32)
    for j in tl.static_range(TOP_K):
        best = tl.max(keys, axis=0)
        pick = BLOCK_E - 1 - (best & 0xFFFFFFFF).to(tl.int32)
        best_ordered = (best >> 32).to(tl.int32)
        value = tl.where(best_ordered < 0, best_ordered ^ 0x7FFFFFFF, best_ordered).to(tl.float32, bitcast=True)
        ids = tl.where(slots == j, pick, ids)
        top = tl.where(slots == j, value, top)
        keys = tl.where(offs == pick, -(2**63), keys)
    largest = tl.max(top, axis=0)
    if SOFTMAX_FIRST:
        weights = tl.exp(top - largest) / tl.sum(tl.exp(logits - largest), axis=0)
        if RENORMALIZE:
            weights = weights / tl.sum(weights, axis=0)
    else:
        weights = tl.exp(top - largest)
        weights = weights / tl.sum(weights, axis=0)
    tl.store(ids_ptr + slots, ids)
    tl.store(weights_ptr + slots, weights)


@triton.jit
def _gate_up_kernel(
    x_ptr, norm_ptr, eps, ids_ptr, w_ptr, bias_ptr, h_ptr, alpha, limit, stride_we,
    H: tl.constexpr, I: tl.constexpr, CLAMPED: tl.constexpr, BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, RSTD_BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    """h[j, rows] = act(gate rows . RMSNorm(x) (+ bias), up rows . RMSNorm(x) (+ bias)) of the j-th chosen expert."""
    wait_for_previous_kernel(PDL)  # the ids (x, before them) are earlier kernels' outputs
    j = tl.program_id(0)
    expert = tl.load(ids_ptr + j).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < I
    gate_rows = w_ptr + expert * stride_we + rows.to(tl.int64)[:, None] * H
    up_rows = gate_rows + I * H
    dtype = w_ptr.dtype.element_ty
    offs = tl.arange(0, BLOCK_K)
    mask = row_mask[:, None] & (offs < H)[None, :]
    # the first weight tiles are in flight while the norm's scale is computed (x is read from L2)
    w_gate = tl.load(gate_rows + offs[None, :], mask=mask, other=0.0)
    w_up = tl.load(up_rows + offs[None, :], mask=mask, other=0.0)
    rstd = input_rstd(x_ptr, eps, H, RSTD_BLOCK)
    normed = input_tile(x_ptr, norm_ptr, offs, offs < H, rstd, dtype, True)[None, :]
    acc_gate = w_gate.to(tl.float32) * normed
    acc_up = w_up.to(tl.float32) * normed
    for k in range(BLOCK_K, H, BLOCK_K):
        cols = k + offs
        col_mask = cols < H
        normed = input_tile(x_ptr, norm_ptr, cols, col_mask, rstd, dtype, True)[None, :]
        mask = row_mask[:, None] & col_mask[None, :]
        acc_gate += tl.load(gate_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32) * normed
        acc_up += tl.load(up_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32) * normed
    gate = tl.sum(acc_gate, axis=1)
    up = tl.sum(acc_up, axis=1)
    if BIAS:  # inside the product's rounding, as F.linear adds it
        gate += tl.load(bias_ptr + expert * 2 * I + rows, mask=row_mask, other=0.0).to(tl.float32)
        up += tl.load(bias_ptr + expert * 2 * I + I + rows, mask=row_mask, other=0.0).to(tl.float32)
    gate = gate.to(dtype).to(tl.float32)
    up = up.to(dtype).to(tl.float32)
    tl.store(h_ptr + j * I + rows, gated(gate, up, alpha, limit, dtype, CLAMPED), mask=row_mask)


@triton.jit
def _down_kernel(
    h_ptr, ids_ptr, weights_ptr, w_ptr, bias_ptr, res_ptr, products_ptr, arrivals_ptr, out_ptr, stride_we,
    H: tl.constexpr, I: tl.constexpr, TOP_K: tl.constexpr, BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    """products[j, rows] = weight_j * (down rows of the j-th chosen expert . h[j] (+ bias)), rounded as the eager code
    rounds; the tile's last program to arrive writes out[rows] = res[rows] + the sum over j, in order of j."""
    wait_for_previous_kernel(PDL)  # h, the routing and the counters' return to zero are earlier kernels' work
    tile = tl.program_id(0)
    j = tl.program_id(1)
    expert = tl.load(ids_ptr + j).to(tl.int64)
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < H
    dtype = w_ptr.dtype.element_ty
    offs = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + expert * stride_we + rows.to(tl.int64)[:, None] * I
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k in range(0, I, BLOCK_K):
        cols = k + offs
        col_mask = cols < I
        h = tl.load(h_ptr + j * I + cols, mask=col_mask, other=0.0).to(tl.float32)
        w = tl.load(w_rows + cols[None, :], mask=row_mask[:, None] & col_mask[None, :], other=0.0)
        acc += w.to(tl.float32) * h[None, :]
    y = tl.sum(acc, axis=1)
    if BIAS:
        y += tl.load(bias_ptr + expert * H + rows, mask=row_mask, other=0.0).to(tl.float32)
    weighted = y.to(dtype).to(tl.float32) * tl.load(weights_ptr + j)
    tl.store(products_ptr + j * H + rows, weighted.to(dtype), mask=row_mask)
    if arrived_last(arrivals_ptr, tile, TOP_K):
        total = tl.zeros([BLOCK_N], tl.float32)
        for i in tl.static_range(TOP_K):  # .cg: from the L2, where the other programs' stores are
            total += tl.load(products_ptr + i * H + rows, mask=row_mask, other=0.0, cache_modifier=".cg").to(tl.float32)
        out = total.to(dtype).to(tl.float32) + tl.load(res_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + rows, out.to(dtype), mask=row_mask)


def one_token_moe(moe: MoE, x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
    """x + moe(norm(x)) for one token x [1, H] (contiguous, 16-bit; `norm` without offset or float32 weight, as
    runtime/native/cuda/fused.py's one-token step checks): the module docstring's kernels."""
    spec, experts, gate = moe.moe, moe.experts, moe.gate
    hidden, inter, top_k = x.shape[1], spec.intermediate_size, spec.top_k
    w13, w2, b13, b2 = experts.gate_up_proj, experts.down_proj, experts.gate_up_proj_bias, experts.down_proj_bias
    launch = dict(PDL=pdl.ENABLED, **pdl.launch_options(pdl.ENABLED))  # read now: gpu_moe_profile turns PDL off
    logits = gemv(x, gate.weight, gate.bias, norm=(norm.weight, norm.eps), pdl=pdl.ENABLED, scale=gate.weight_scale)
    block_topk = triton.next_power_of_2(top_k)
    ids = torch.empty(block_topk, dtype=torch.int32, device=x.device)
    weights = torch.empty(block_topk, dtype=torch.float32, device=x.device)
    _route_kernel[(1,)](logits, ids, weights, E=spec.num_experts, BLOCK_E=triton.next_power_of_2(spec.num_experts),
                        TOP_K=top_k, BLOCK_TOPK=block_topk, SOFTMAX_FIRST=spec.routing == "softmax_topk",
                        RENORMALIZE=spec.renormalize, num_warps=1, **launch)
    h = torch.empty((top_k, inter), dtype=x.dtype, device=x.device)
    block_n, block_k, warps = GATE_UP_TILE
    _gate_up_kernel[(top_k, triton.cdiv(inter, block_n))](
        x, norm.weight, norm.eps, ids, w13, w13 if b13 is None else b13, h, spec.alpha, spec.limit, w13.stride(0),
        H=hidden, I=inter, CLAMPED=spec.activation == "swiglu_clamp", BIAS=b13 is not None, BLOCK_N=block_n,
        BLOCK_K=min(block_k, triton.next_power_of_2(hidden)), RSTD_BLOCK=rstd_block(hidden), num_warps=warps,
        **launch,
    )
    out = torch.empty_like(x)
    products = torch.empty((top_k, hidden), dtype=x.dtype, device=x.device)
    block_n, block_k, warps = DOWN_TILE
    tiles = triton.cdiv(hidden, block_n)
    _down_kernel[(tiles, top_k)](
        h, ids, weights, w2, w2 if b2 is None else b2, x, products, counters(x.device, tiles), out, w2.stride(0),
        H=hidden, I=inter, TOP_K=top_k, BIAS=b2 is not None, BLOCK_N=block_n,
        BLOCK_K=min(block_k, triton.next_power_of_2(inter)), num_warps=warps, **launch,
    )
    return out
