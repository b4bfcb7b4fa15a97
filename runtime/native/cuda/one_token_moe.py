"""A mixture-of-experts layer's MLP for one token (the batch-1 decode step) in three kernels.

`one_token_moe(moe, x, norm)` is `x + moe(norm(x))` (runtime/native/models/moe.py), for a 16-bit x [1, H]:

1. the router: runtime/native/cuda/gemv.py's GEMV body with its RMSNorm prologue writes the E logits; the last of
   its programs to finish (an atomic counter) picks the token's k experts from them (`_top_k`: route's choice) and
   writes their ids and router weights, so that no expert program computes a top-k before its first weight address
   is known (ROUTING = "router"; "kernel": the routing in a one-program kernel of its own after the GEMV);
2. gate/up: program (j, tile) reads the j-th chosen expert's gate and up rows of the tile over RMSNorm(x) and writes
   their gated activation h[j, tile];
3. down (DOWN_SPLIT): program (tile, j) reads its output rows of the j-th expert's down matrix, weights the product
   by the router weight and stores it; the last of a tile's k programs to arrive (an atomic counter) sums the k
   products in order and adds the residual x (the counters, `_counters`, are back at zero when a kernel ends; the
   CUDA tests check both kernels' results token after token). Without DOWN_SPLIT a program owns rows of the output over all k
   experts in turn (k dependent loads: too few programs for the H200's 132 SMs at H = 2048).

ROUTING = "inline" with DOWN_SPLIT = False is the earlier layer (each expert kernel finding the top-k itself after
the router's GEMV), kept with "kernel" for benchmarks/gpu_moe_profile.py's A/B on the device.

Why: the general path (runtime/native/cuda/moe.py's `fused_experts` after the eager router) took 12 kernels: an RMSNorm,
the router's matmul, a cast, softmax, top-k, sum and division, two GEMVs and the activation, the sum over k and
the residual add. A batch-1 step of Qwen3-30B-A3B (48 such layers, 17 kernels each in all) took 4.17 ms on the
H200 against its 1.47 ms floor (benchmarks/RESULTS.md); Qwen3-8B's step, 7 kernels a layer, was 1.17x its floor.
Here every expert product reads only the k chosen experts' weights (3 x 768 x 2048 per expert there), spread over
many programs: k x I / BLOCK_N programs for gate/up, k x H / BLOCK_N for down. Every kernel is a programmatic dependent
launch (runtime/native/cuda/pdl.py).

Roundings follow the eager code: the logits and each product in the activations' dtype, the weighting in float32
then rounded, the sum over k in float32 then rounded, then the residual add; only the order of a dot product's sums
differs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runtime.native.cuda import pdl
from runtime.native.cuda.gemv import (
    gemv,
    input_rstd,
    input_tile,
    project_rows,
    tile_for,
)
from runtime.native.cuda.moe import gated
from runtime.native.cuda.pdl import wait_for_previous_kernel
from runtime.native.models.moe import MoE
from runtime.native.models.norm import RMSNorm

# (BLOCK_N, BLOCK_K, num_warps): gate/up programs own BLOCK_N gate rows and their BLOCK_N up rows; down programs
# BLOCK_N output rows over all k experts. Sized as the dense GEMVs' best tiles (runtime/native/cuda/gemv.py): 16 KB of
# weights in flight per program and loop step; benchmarks/gpu_moe_profile.py times the alternatives.
GATE_UP_TILE = (4, 1024, 4)
DOWN_TILE = (8, 1024, 4)  # with DOWN_SPLIT: BLOCK_N rows of one expert (I = 768 is one masked 1024-column step)
ROUTING = "router"  # or "kernel", "inline" (the module docstring)
DOWN_SPLIT = True  # not with "inline"

# per device: the router's and the down programs' counters, back at zero when each kernel ends (kernels in stream
# order: the next one's programs wait for the previous kernel before they count)
_arrivals: dict[torch.device, torch.Tensor] = {}


def _counters(device: torch.device, n: int) -> torch.Tensor:
    """n int32 counters at zero; the kernel that uses them leaves them at zero."""
    held = _arrivals.get(device)
    if held is None or held.numel() < n:
        held = _arrivals[device] = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
    return held


@triton.jit
def _top_k(logits_ptr, E: tl.constexpr, BLOCK_E: tl.constexpr, TOP_K: tl.constexpr, BLOCK_TOPK: tl.constexpr,
           SOFTMAX_FIRST: tl.constexpr, RENORMALIZE: tl.constexpr):
    """One token's experts as runtime/native/models/moe.py's `route` picks them from its E router logits: ([BLOCK_TOPK]
    expert ids, [BLOCK_TOPK] float32 weights), slot j the j-th largest logit (ties: the lower id); slots from TOP_K
    on hold id 0 and weight 0. SOFTMAX_FIRST: softmax over all E, the chosen ones' probabilities (divided by their
    sum when RENORMALIZE); else the softmax of the chosen logits.

    Each pick is one max over int64 keys, the logit's bits ordered as the floats above the id reversed: one
    reduction where a max then the lowest id holding it took two (their barriers came before any weight load)."""
    offs = tl.arange(0, BLOCK_E)
    # .cg: from the L2, where the router's other programs stored theirs (read by its last one)
    logits = tl.load(logits_ptr + offs, mask=offs < E, other=float("-inf"), cache_modifier=".cg").to(tl.float32)
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
    return ids, weights


@triton.jit
def _slot(values, j, BLOCK_TOPK: tl.constexpr):
    """values[j] of a [BLOCK_TOPK] vector, j a program id or a loop index."""
    return tl.sum(tl.where(tl.arange(0, BLOCK_TOPK) == j, values, 0), axis=0)


@triton.jit
def _router_kernel(
    x_ptr, w_ptr, norm_ptr, bias_ptr, scale_ptr, eps, logits_ptr, arrivals_ptr, ids_ptr, weights_ptr,
    E: tl.constexpr, H: tl.constexpr, BLOCK_E: tl.constexpr, TOP_K: tl.constexpr, BLOCK_TOPK: tl.constexpr,
    SOFTMAX_FIRST: tl.constexpr, RENORMALIZE: tl.constexpr, BIAS: tl.constexpr, SCALED: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    """logits = the router's W RMSNorm(x) (+ bias), as `gemv` writes them; then, in the last program to arrive,
    ids and weights as `_route_kernel` writes them."""
    rows, row_mask, out = project_rows(x_ptr, w_ptr, norm_ptr, bias_ptr, scale_ptr, eps, E, H, BLOCK_N, BLOCK_K,
                                       True, False, BIAS, SCALED, PDL)
    tl.store(logits_ptr + rows, out.to(x_ptr.dtype.element_ty), mask=row_mask)
    tl.debug_barrier()  # every thread's logits stored before the release below
    if tl.atomic_add(arrivals_ptr, 1, sem="acq_rel") == tl.num_programs(0) - 1:
        ids, weights = _top_k(logits_ptr, E, BLOCK_E, TOP_K, BLOCK_TOPK, SOFTMAX_FIRST, RENORMALIZE)
        tl.store(ids_ptr + tl.arange(0, BLOCK_TOPK), ids)
        tl.store(weights_ptr + tl.arange(0, BLOCK_TOPK), weights)
        tl.store(arrivals_ptr, 0)  # for the next launch


@triton.jit
def _route_kernel(logits_ptr, ids_ptr, weights_ptr, E: tl.constexpr, BLOCK_E: tl.constexpr, TOP_K: tl.constexpr,
                  BLOCK_TOPK: tl.constexpr, SOFTMAX_FIRST: tl.constexpr, RENORMALIZE: tl.constexpr,
                  PDL: tl.constexpr):
    """ids[BLOCK_TOPK] (int32) and weights[BLOCK_TOPK] (float32) as `_top_k` gives them, from the E logits."""
    wait_for_previous_kernel(PDL)
    ids, weights = _top_k(logits_ptr, E, BLOCK_E, TOP_K, BLOCK_TOPK, SOFTMAX_FIRST, RENORMALIZE)
    tl.store(ids_ptr + tl.arange(0, BLOCK_TOPK), ids)
    tl.store(weights_ptr + tl.arange(0, BLOCK_TOPK), weights)


@triton.jit
def _gate_up_kernel(
    x_ptr, norm_ptr, eps, logits_ptr, ids_ptr, w_ptr, bias_ptr, h_ptr, alpha, limit, stride_we,
    H: tl.constexpr, I: tl.constexpr, E: tl.constexpr, BLOCK_E: tl.constexpr, TOP_K: tl.constexpr,
    BLOCK_TOPK: tl.constexpr, SOFTMAX_FIRST: tl.constexpr, RENORMALIZE: tl.constexpr, CLAMPED: tl.constexpr,
    BIAS: tl.constexpr, ROUTED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    """h[j, rows] = act(gate rows . RMSNorm(x) (+ bias), up rows . RMSNorm(x) (+ bias)) of the j-th chosen expert:
    its id from `_route_kernel`'s ids when ROUTED, else from the logits here."""
    wait_for_previous_kernel(PDL)  # the ids (x, the logits, before them) are earlier kernels' outputs
    j = tl.program_id(0)
    if ROUTED:
        expert = tl.load(ids_ptr + j).to(tl.int64)
    else:
        ids, _ = _top_k(logits_ptr, E, BLOCK_E, TOP_K, BLOCK_TOPK, SOFTMAX_FIRST, RENORMALIZE)
        expert = _slot(ids, j, BLOCK_TOPK).to(tl.int64)
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
    rstd = input_rstd(x_ptr, eps, H, BLOCK_K)
    normed = input_tile(x_ptr, norm_ptr, offs, offs < H, rstd, H, dtype, True, False)[None, :]
    acc_gate = w_gate.to(tl.float32) * normed
    acc_up = w_up.to(tl.float32) * normed
    for k in range(BLOCK_K, H, BLOCK_K):
        cols = k + offs
        col_mask = cols < H
        normed = input_tile(x_ptr, norm_ptr, cols, col_mask, rstd, H, dtype, True, False)[None, :]
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
def _down_rows(h_ptr, w_ptr, bias_ptr, rows, row_mask, H: tl.constexpr, I: tl.constexpr, BIAS: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """float32 [BLOCK_N]: one expert's down rows (w_ptr its [H, I] matrix) . h [I] (+ its bias at rows)."""
    offs = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * I
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k in range(0, I, BLOCK_K):
        cols = k + offs
        col_mask = cols < I
        h = tl.load(h_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        w = tl.load(w_rows + cols[None, :], mask=row_mask[:, None] & col_mask[None, :], other=0.0)
        acc += w.to(tl.float32) * h[None, :]
    y = tl.sum(acc, axis=1)
    if BIAS:
        y += tl.load(bias_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    return y


@triton.jit
def _down_kernel(
    h_ptr, logits_ptr, ids_ptr, weights_ptr, w_ptr, bias_ptr, res_ptr, out_ptr, stride_we,
    H: tl.constexpr, I: tl.constexpr, E: tl.constexpr, BLOCK_E: tl.constexpr, TOP_K: tl.constexpr,
    BLOCK_TOPK: tl.constexpr, SOFTMAX_FIRST: tl.constexpr, RENORMALIZE: tl.constexpr, BIAS: tl.constexpr,
    ROUTED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    """out[rows] = res[rows] + sum over j of weight_j * (down rows of the j-th chosen expert . h[j] (+ bias))."""
    wait_for_previous_kernel(PDL)  # h is the previous kernel's output
    if ROUTED:
        ids = tl.load(ids_ptr + tl.arange(0, BLOCK_TOPK))
        weights = tl.load(weights_ptr + tl.arange(0, BLOCK_TOPK))
    else:
        ids, weights = _top_k(logits_ptr, E, BLOCK_E, TOP_K, BLOCK_TOPK, SOFTMAX_FIRST, RENORMALIZE)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < H
    dtype = w_ptr.dtype.element_ty
    total = tl.zeros([BLOCK_N], tl.float32)
    for j in tl.static_range(TOP_K):
        expert = _slot(ids, j, BLOCK_TOPK).to(tl.int64)
        y = _down_rows(h_ptr + j * I, w_ptr + expert * stride_we, bias_ptr + expert * H, rows, row_mask, H, I, BIAS,
                       BLOCK_N, BLOCK_K)
        total += (y.to(dtype).to(tl.float32) * _slot(weights, j, BLOCK_TOPK)).to(dtype).to(tl.float32)
    out = total.to(dtype).to(tl.float32) + tl.load(res_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows, out.to(dtype), mask=row_mask)


@triton.jit
def _down_split_kernel(
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
    y = _down_rows(h_ptr + j * I, w_ptr + expert * stride_we, bias_ptr + expert * H, rows, row_mask, H, I, BIAS,
                   BLOCK_N, BLOCK_K)
    weighted = y.to(dtype).to(tl.float32) * tl.load(weights_ptr + j)
    tl.store(products_ptr + j * H + rows, weighted.to(dtype), mask=row_mask)
    tl.debug_barrier()  # every thread's products stored before the release below
    if tl.atomic_add(arrivals_ptr + tile, 1, sem="acq_rel") == TOP_K - 1:
        total = tl.zeros([BLOCK_N], tl.float32)
        for i in tl.static_range(TOP_K):  # .cg: from the L2, where the other programs' stores are
            total += tl.load(products_ptr + i * H + rows, mask=row_mask, other=0.0, cache_modifier=".cg").to(tl.float32)
        out = total.to(dtype).to(tl.float32) + tl.load(res_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + rows, out.to(dtype), mask=row_mask)
        tl.store(arrivals_ptr + tile, 0)  # for the next launch


def one_token_moe(moe: MoE, x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
    """x + moe(norm(x)) for one token x [1, H] (contiguous, 16-bit; `norm` without offset or float32 weight, as
    runtime/native/cuda/fused.py's one-token step checks): the module docstring's kernels."""
    spec, experts = moe.moe, moe.experts
    hidden, inter = x.shape[1], spec.intermediate_size
    routing = dict(E=spec.num_experts, BLOCK_E=triton.next_power_of_2(spec.num_experts), TOP_K=spec.top_k,
                   BLOCK_TOPK=triton.next_power_of_2(spec.top_k), SOFTMAX_FIRST=spec.routing == "softmax_topk",
                   RENORMALIZE=spec.renormalize, PDL=pdl.ENABLED, **pdl.launch_options())
    w13, w2, b13, b2 = experts.gate_up_proj, experts.down_proj, experts.gate_up_proj_bias, experts.down_proj_bias
    routed = ROUTING != "inline"
    ids = torch.empty(routing["BLOCK_TOPK"], dtype=torch.int32, device=x.device)
    weights = torch.empty(routing["BLOCK_TOPK"], dtype=torch.float32, device=x.device)
    gate = moe.gate
    if ROUTING == "router":
        logits = torch.empty((1, spec.num_experts), dtype=x.dtype, device=x.device)
        block_n, block_k, warps = tile_for(spec.num_experts, hidden, gate.weight_scale is not None)
        _router_kernel[(triton.cdiv(spec.num_experts, block_n),)](
            x, gate.weight, norm.weight, gate.weight if gate.bias is None else gate.bias,
            gate.weight if gate.weight_scale is None else gate.weight_scale, norm.eps, logits,
            _counters(x.device, 1), ids, weights, H=hidden, BIAS=gate.bias is not None,
            SCALED=gate.weight_scale is not None, BLOCK_N=block_n,
            BLOCK_K=min(block_k, triton.next_power_of_2(hidden)), num_warps=warps, **routing,
        )
    else:
        logits = gemv(x, gate.weight, gate.bias, norm=(norm.weight, norm.eps), pdl=pdl.ENABLED,
                      scale=gate.weight_scale)
    if ROUTING == "kernel":
        _route_kernel[(1,)](logits, ids, weights, num_warps=1, **routing)
    h = torch.empty((spec.top_k, inter), dtype=x.dtype, device=x.device)
    block_n, block_k, warps = GATE_UP_TILE
    _gate_up_kernel[(spec.top_k, triton.cdiv(inter, block_n))](
        x, norm.weight, norm.eps, logits, ids, w13, w13 if b13 is None else b13, h, spec.alpha, spec.limit,
        w13.stride(0), H=hidden, I=inter, CLAMPED=spec.activation == "swiglu_clamp", BIAS=b13 is not None,
        ROUTED=routed, BLOCK_N=block_n, BLOCK_K=min(block_k, triton.next_power_of_2(hidden)), num_warps=warps,
        **routing,
    )
    out = torch.empty_like(x)
    block_n, block_k, warps = DOWN_TILE
    block_k = min(block_k, triton.next_power_of_2(inter))
    tiles = triton.cdiv(hidden, block_n)
    if routed and DOWN_SPLIT:
        products = torch.empty((spec.top_k, hidden), dtype=x.dtype, device=x.device)
        _down_split_kernel[(tiles, spec.top_k)](
            h, ids, weights, w2, w2 if b2 is None else b2, x, products, _counters(x.device, tiles), out,
            w2.stride(0), H=hidden, I=inter, TOP_K=spec.top_k, BIAS=b2 is not None, BLOCK_N=block_n,
            BLOCK_K=block_k, num_warps=warps, PDL=pdl.ENABLED, **pdl.launch_options(),
        )
        return out
    _down_kernel[(tiles,)](
        h, logits, ids, weights, w2, w2 if b2 is None else b2, x, out, w2.stride(0), H=hidden, I=inter,
        BIAS=b2 is not None, ROUTED=routed, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, **routing,
    )
    return out
