"""Fused Triton kernels for the elementwise parts of a Llama layer on CUDA.

Why: at decode batch sizes a layer's matmuls take microseconds, and eager RMSNorm (8 kernels),
RoPE (18) and SwiGLU (2) launches cost as much again, even inside a CUDA graph. Each becomes one
kernel here (the norms in runtime/native/cuda/norms.py; Qwen3's and Gemma 3's q/k head norms inside the
RoPE kernels), and each residual add joins the RMSNorm after it (Llama models run `_llama_forward`: two
kernels fewer per layer, 32 of a batch-1 step's 213 on the 1B shape, 1.2 us each on an H100), and RoPE
writes the rotated K and the V of each new token straight into its KV cache slot (one kernel fewer per
layer); in a step of one-token rows it does so inside the decode-attention kernel (one more fewer). A
16-bit one-token step goes further: its projections are GEMVs that carry the norms, SwiGLU and residual
adds (runtime/native/cuda/gemv.py), four kernels a layer besides attention (an experts layer's MLP: four,
runtime/native/cuda/one_token_moe.py). They round intermediates to the activation dtype where the eager code
does, so results match the eager modules (runtime/native/models/norm.py, rotary_embedding.py, llama.py) up to
the last bit of the transcendental functions and the order of a dot product's sums. In a multi-row step of an FP8
model, the norms before the q/k/v and gate/up projections and the SwiGLU before down also write their rows' E4M3
form (Fp8Rows: runtime/native/cuda/fp8_quant.py's rounding, bit for bit), three quantizing kernels a layer fewer.

`use_fused_kernels(model)` swaps the `forward` of the matching module instances; model files stay
device-agnostic and the CPU path is untouched.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import nn

from runtime.native.attention_metadata import AttentionMetadata
from runtime.native.cuda import paged_attention, pdl
from runtime.native.cuda.fp8_quant import fp8_buffers
from runtime.native.cuda.gemv import MAX_TOKENS, gemv, takes_tokens
from runtime.native.cuda.norms import add_rms_norm, rms_norm, scaled_norm
from runtime.native.cuda.one_token_moe import one_token_moe
from runtime.native.cuda.paged_attention import attend_decode_group, attend_over_cache, to_cache
from runtime.native.cuda.pdl import wait_for_previous_kernel
from runtime.native.cuda.swiglu import silu_and_mul
from runtime.native.models.fp8 import Fp8Rows
from runtime.native.models.kv_scales import UNIT, KvScales, cache_scales
from runtime.native.parallel.group import current


@triton.jit
def _rope_factors(pos_ptr, cos_ptr, sin_ptr, t, stride_cache, D: tl.constexpr, BLOCK_D: tl.constexpr, dtype):
    """Rotate-half RoPE as each of a head's D elements sees it, for token t: out[d] = x[d] cos[d] + sign[d] *
    x[partner[d]] sin[d] (partner: the element D/2 away; sign -1 in the first half). Returns (cos, sin, partner,
    sign, mask) over BLOCK_D lanes, cos/sin rounded to the activation dtype as the eager cache lookup is."""
    half: tl.constexpr = D // 2
    offs_d = tl.arange(0, BLOCK_D)
    mask = offs_d < D
    first = offs_d < half
    pos = tl.load(pos_ptr + t).to(tl.int64)
    cos = tl.load(cos_ptr + pos * stride_cache + offs_d % half, mask=mask, other=0.0).to(dtype).to(tl.float32)
    sin = tl.load(sin_ptr + pos * stride_cache + offs_d % half, mask=mask, other=0.0).to(dtype).to(tl.float32)
    return cos, sin, tl.where(first, offs_d + half, offs_d - half), tl.where(first, -1.0, 1.0), mask


@triton.jit
def _rotate(rows, mask, cos, sin, partner, sign, dtype, norm_ptr, eps, D: tl.constexpr, NORM: tl.constexpr,
            OFFSET: tl.constexpr, WEIGHT_F32: tl.constexpr):
    """RoPE of the heads starting at `rows` ([R, 1] pointers; lanes as _rope_factors), in `dtype`, with the eager
    order of roundings (runtime/native/models/rotary_embedding.py): each product, then the sum. Both kernels below rotate
    through this one function, so a token's K is the same bits whichever of them stored it: speculation's verified
    tokens go through the first, plain decoding through the second. (Written as two half-width products, the first
    kernel's bf16 K differed from the eager module's in the last bit on about 1 element in 3 on an H100.)

    NORM: each head RMS-normalised first (Qwen3's and Gemma 3's q/k norms; `norm_ptr` its weight, OFFSET and
    WEIGHT_F32 as runtime/native/cuda/norms.py's), its squares summed in float64, where the order of the sum (which
    differs between the kernels' tiles) almost never reaches the float32 result: the kernels agree bit for bit.
    (Head norms were two kernels of their own a layer before.)"""
    offs_d = tl.arange(0, cos.shape[0])
    x = tl.load(rows + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    x_partner = tl.load(rows + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    if NORM:
        wide = x.to(tl.float64)
        rstd = (1.0 / tl.sqrt(tl.sum(wide * wide, axis=1).to(tl.float32) / D + eps))[:, None]
        d_mask = offs_d < D
        x = scaled_norm(x * rstd, norm_ptr, offs_d, d_mask, dtype, OFFSET, WEIGHT_F32).to(tl.float32)
        x_partner = scaled_norm(x_partner * rstd, norm_ptr, partner, d_mask, dtype, OFFSET, WEIGHT_F32).to(tl.float32)
    if dtype == tl.float32:  # one rounding where the compiler may contract the product and the sum: contracted in
        return tl.fma(x, cos[None, :], sign[None, :] * (x_partner * sin[None, :]))  # each kernel, the same bits
    return ((x * cos[None, :]).to(dtype).to(tl.float32)
            + sign[None, :] * (x_partner * sin[None, :]).to(dtype).to(tl.float32)).to(dtype)


@triton.jit(do_not_specialize_on_alignment=["pos_ptr", "slot_ptr"])  # step metadata (runtime/native/cuda/paged_attention.py)
def _rope_store_kv_kernel(
    pos_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, qo_ptr, cache_ptr, slot_ptr, v_offset,
    stride_q, stride_k, stride_v, stride_cache, q_norm_ptr, k_norm_ptr, q_eps, k_eps, k_scale, v_scale,
    HQ: tl.constexpr, HK: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HK: tl.constexpr, D: tl.constexpr,
    BLOCK_D: tl.constexpr, PDL: tl.constexpr, NORM: tl.constexpr, OFFSET: tl.constexpr, WEIGHT_F32: tl.constexpr,
):
    """A token's q heads (a tile of BLOCK_H rows) and its K and V heads (BLOCK_HK rows: in the query heads' tile,
    three quarters masked at 32 / 8 heads, they cost as much as the q heads; a 1B prompt layer 13.1 -> 4.6 us)."""
    wait_for_previous_kernel(PDL)
    t = tl.program_id(0).to(tl.int64)
    dtype = qo_ptr.dtype.element_ty
    cos, sin, partner, sign, d_mask = _rope_factors(pos_ptr, cos_ptr, sin_ptr, t, stride_cache, D, BLOCK_D, dtype)
    offs_h = tl.arange(0, BLOCK_H)
    heads = offs_h[:, None] * D + tl.arange(0, BLOCK_D)[None, :]
    mask = (offs_h < HQ)[:, None] & d_mask[None, :]
    q = _rotate(q_ptr + t * stride_q + offs_h[:, None] * D, mask, cos, sin, partner, sign, dtype, q_norm_ptr, q_eps,
                D, NORM, OFFSET, WEIGHT_F32)
    tl.store(qo_ptr + t * HQ * D + heads, q, mask=mask)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:  # slot < 0: a padded row of a replayed graph, which stores nothing
        offs_kv = tl.arange(0, BLOCK_HK)
        kv_heads = offs_kv[:, None] * D + tl.arange(0, BLOCK_D)[None, :]
        kv_mask = (offs_kv < HK)[:, None] & d_mask[None, :]
        k = _rotate(k_ptr + t * stride_k + offs_kv[:, None] * D, kv_mask, cos, sin, partner, sign, dtype, k_norm_ptr,
                    k_eps, D, NORM, OFFSET, WEIGHT_F32)
        tl.store(cache_ptr + slot * HK * D + kv_heads, to_cache(k, k_scale, cache_ptr), mask=kv_mask)
        v = tl.load(v_ptr + t * stride_v + kv_heads, mask=kv_mask)
        tl.store(cache_ptr + v_offset + slot * HK * D + kv_heads, to_cache(v, v_scale, cache_ptr), mask=kv_mask)


@triton.jit(do_not_specialize=["stride_tb"],
            do_not_specialize_on_alignment=["pos_ptr", "slot_ptr", "tables_ptr", "seq_lens_ptr"])
def _rope_decode_kernel(
    pos_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, cache_ptr, out_ptr, slot_ptr, tables_ptr, seq_lens_ptr,
    scale, k_scale, v_scale, v_offset, stride_q, stride_k, stride_v, stride_cache, stride_o, stride_tb, window,
    sinks_ptr, q_norm_ptr, k_norm_ptr, q_eps, k_eps,
    BLOCK_SIZE: tl.constexpr, HKV: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr,
    WINDOWED: tl.constexpr, SINKS: tl.constexpr, NORM: tl.constexpr, OFFSET: tl.constexpr, WEIGHT_F32: tl.constexpr,
):
    """_rope_store_kv_kernel then paged_attention's _decode_kernel, for one (sequence, KV head): the new token's
    rotated K and its V of this head go to its slot, its query group is rotated in registers, then attends.

    A step that continues a sequence by several rows (a verification's, a draft model's catch-up: one row a token,
    in order) has each row attend over the keys of the rows before it, which their own programs store: programs of
    one kernel run in no guaranteed order, so each program also stores the K and V of the rows before it that continue
    its sequence (the same bits their own programs store) before its barrier, and its loads see them.

    The step's metadata and the RoPE tables are read before the programmatic-launch wait (runtime/native/cuda/pdl.py:
    no programmatic kernel writes them), and the rows before this one that continue its sequence are counted there:
    graphed batch-1 step 8B FP8 2.663 -> 2.626 ms, Qwen3-30B-A3B 2.559 -> 2.503 (H200, 2026-11-30)."""
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    dtype = q_ptr.dtype.element_ty
    cos, sin, partner, sign, d_mask = _rope_factors(pos_ptr, cos_ptr, sin_ptr, b, stride_cache, D, BLOCK_D, dtype)
    offs_d = tl.arange(0, BLOCK_D)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    table = tables_ptr + b * stride_tb
    earlier = b * 0  # rows before this one that continue its sequence
    while _continues_sequence(b - earlier - 1, seq_len - 2 - earlier, slot_ptr, seq_lens_ptr, table, BLOCK_SIZE):
        earlier += 1
    wait_for_previous_kernel(PDL)  # q, k and v are the previous kernel's output
    if slot >= 0:  # slot < 0: a padded row of a replayed graph, which stores nothing
        _store_row_kv(b, slot, cos, sin, partner, sign, d_mask, k_ptr, v_ptr, stride_k, stride_v, kvh, cache_ptr,
                      v_offset, k_scale, v_scale, k_norm_ptr, k_eps, dtype, HKV, D, NORM, OFFSET, WEIGHT_F32)
    for back in range(1, earlier + 1):
        row = b - back
        row_cos, row_sin, _, _, _ = _rope_factors(pos_ptr, cos_ptr, sin_ptr, row, stride_cache, D, BLOCK_D, dtype)
        _store_row_kv(row, tl.load(slot_ptr + row).to(tl.int64), row_cos, row_sin, partner, sign, d_mask, k_ptr,
                      v_ptr, stride_k, stride_v, kvh, cache_ptr, v_offset, k_scale, v_scale, k_norm_ptr, k_eps, dtype,
                      HKV, D, NORM, OFFSET, WEIGHT_F32)
    offs_g = tl.arange(0, BLOCK_G)
    mask = (offs_g < GROUP)[:, None] & d_mask[None, :]
    heads = kvh * GROUP + offs_g
    q = _rotate(q_ptr + b * stride_q + heads[:, None] * D, mask, cos, sin, partner, sign, dtype, q_norm_ptr, q_eps, D,
                NORM, OFFSET, WEIGHT_F32)
    q = (q.to(tl.float32) * scale).to(dtype)  # (times k_scale: as paged_attention's kernels read an FP8 cache)
    tl.debug_barrier()  # this program's K/V stores are seen by its loads below
    out = attend_decode_group(q, heads, offs_g < GROUP, seq_len, cache_ptr, table, kvh, v_offset, window, sinks_ptr,
                              BLOCK_G, BLOCK_SIZE, HKV, D, BLOCK_D, BLOCK_N, PRECISION, WINDOWED, SINKS)
    tl.store(out_ptr + b * stride_o + heads[:, None] * D + offs_d[None, :],
             (out * v_scale).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _store_row_kv(t, slot, cos, sin, partner, sign, d_mask, k_ptr, v_ptr, stride_k, stride_v, kvh, cache_ptr, v_offset,
                  k_scale, v_scale, k_norm_ptr, k_eps, dtype, HKV: tl.constexpr, D: tl.constexpr, NORM: tl.constexpr,
                  OFFSET: tl.constexpr, WEIGHT_F32: tl.constexpr):
    """Row t's rotated K and its V of KV head `kvh` (RoPE factors `cos`, `sin`: its position's) to cache slot `slot`."""
    one = tl.arange(0, 1)[:, None]  # the KV head as a one-row tile, the shape _rotate works on
    lanes = one + tl.arange(0, cos.shape[0])[None, :]
    mask = (one >= 0) & d_mask[None, :]
    k = _rotate(k_ptr + t * stride_k + kvh * D + one, mask, cos, sin, partner, sign, dtype, k_norm_ptr, k_eps, D,
                NORM, OFFSET, WEIGHT_F32)
    row = (slot * HKV + kvh) * D + lanes
    tl.store(cache_ptr + row, to_cache(k, k_scale, cache_ptr), mask=mask)
    v = tl.load(v_ptr + t * stride_v + kvh * D + lanes, mask=mask)
    tl.store(cache_ptr + v_offset + row, to_cache(v, v_scale, cache_ptr), mask=mask)


@triton.jit
def _continues_sequence(row, pos, slot_ptr, seq_lens_ptr, table, BLOCK_SIZE: tl.constexpr):
    """Whether step row `row` holds the token at position `pos` of the sequence whose block table is `table`: its
    slot is where that table puts `pos` (a slot being written belongs to one sequence), its length pos + 1."""
    ok = (row >= 0) & (pos >= 0)
    slot = tl.load(slot_ptr + row, mask=ok, other=-1).to(tl.int64)
    ok = ok & (slot >= 0) & (tl.load(seq_lens_ptr + row, mask=ok, other=0) == pos + 1)
    block = tl.load(table + pos // BLOCK_SIZE, mask=ok, other=0).to(tl.int64)
    return ok & (slot == block * BLOCK_SIZE + pos % BLOCK_SIZE)


def _norm_arguments(norms: tuple[nn.Module, nn.Module] | None,
                    q: torch.Tensor) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The RoPE kernels' q/k norm arguments: (weights and epsilons, constexprs); without norms, placeholders."""
    if norms is None:
        return (q, q, 0.0, 0.0), {"NORM": False, "OFFSET": 0.0, "WEIGHT_F32": False}
    q_norm, k_norm = norms
    return ((q_norm.weight, k_norm.weight, q_norm.eps, k_norm.eps),
            {"NORM": True, "OFFSET": q_norm.offset, "WEIGHT_F32": q_norm.weight_in_float32})


def rope_store_kv(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  cos_cache: torch.Tensor, sin_cache: torch.Tensor, head_dim: int, kv_cache: torch.Tensor,
                  slot_mapping: torch.Tensor, norms: tuple[nn.Module, nn.Module] | None = None,
                  kv_scales: KvScales = UNIT) -> torch.Tensor:
    """Rotate-half RoPE of packed q [T, Hq*D] and k [T, Hk*D] (rows may be strided views), then store_kv
    (runtime/native/cuda/paged_attention.py) in the same kernel: each token's rotated K and its V go straight to its
    cache slot (none for slot < 0), divided by an FP8 cache's `kv_scales`; returns the rotated q [T, Hq*D]. `norms`:
    the (q, k) RMSNorms of every head, applied first (Qwen3, Gemma 3)."""
    tokens = q.shape[0]
    hq, hk = q.shape[1] // head_dim, k.shape[1] // head_dim
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if tokens:
        _, num_blocks, block_size, _, _ = kv_cache.shape
        norm_args, norm_options = _norm_arguments(norms, q)
        _rope_store_kv_kernel[(tokens,)](
            positions, cos_cache, sin_cache, q, k, v, q_out, kv_cache, slot_mapping,
            num_blocks * block_size * hk * head_dim, q.stride(0), k.stride(0), v.stride(0), cos_cache.stride(0),
            *norm_args, kv_scales.k, kv_scales.v, HQ=hq, HK=hk, BLOCK_H=triton.next_power_of_2(hq),
            BLOCK_HK=triton.next_power_of_2(hk), D=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), PDL=pdl.ENABLED,
            **norm_options, **pdl.launch_options(),
        )
    return q_out


def rope_decode_attention(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          cos_cache: torch.Tensor, sin_cache: torch.Tensor, kv_cache: torch.Tensor,
                          meta: AttentionMetadata, scale: float, window: int | None = None,
                          sinks: torch.Tensor | None = None, norms: tuple[nn.Module, nn.Module] | None = None,
                          kv_scales: KvScales = UNIT) -> torch.Tensor:
    """rope_store_kv then decode_attention (runtime/native/cuda/paged_attention.py) in one kernel, for a step of one new
    token per sequence: q [B, Hq*D], k and v [B, Hkv*D] (rows may be strided views) -> [B, Hq*D]."""
    _, num_blocks, block_size, kv_heads, head_dim = kv_cache.shape
    batch, width = q.shape
    group = width // head_dim // kv_heads
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    tables = meta.block_tables
    norm_args, norm_options = _norm_arguments(norms, q)
    _rope_decode_kernel[(batch, kv_heads)](
        positions, cos_cache, sin_cache, q, k, v, kv_cache, out, meta.slot_mapping, tables, meta.seq_lens,
        scale * kv_scales.k, kv_scales.k, kv_scales.v, num_blocks * block_size * kv_heads * head_dim, q.stride(0),
        k.stride(0), v.stride(0), cos_cache.stride(0),
        out.stride(0), tables.stride(0), window or 0, q if sinks is None else sinks, *norm_args,
        BLOCK_SIZE=block_size, HKV=kv_heads, GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)),
        D=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_N=paged_attention.DECODE_BLOCK_N,
        PRECISION=paged_attention.precision(q.dtype), num_warps=paged_attention.DECODE_NUM_WARPS,
        PDL=pdl.ENABLED, WINDOWED=window is not None, SINKS=sinks is not None, **norm_options, **pdl.launch_options(),
    )
    return out


def _rms_norm_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return rms_norm(x, self.weight, self.eps, self.offset, self.weight_in_float32)


def _llama_attention_forward(self: nn.Module, positions: torch.Tensor, x: torch.Tensor | Fp8Rows,
                             kv_cache: torch.Tensor | None, meta: AttentionMetadata) -> torch.Tensor:
    """LlamaAttention.forward with RoPE and the KV store in one kernel (the attention backend then only attends)."""
    if kv_cache is None:  # the cache-less profiling pass: the eager modules
        return type(self).forward(self, positions, x, kv_cache, meta)
    q, k, v = self.qkv_proj.split(self.qkv_proj(x))
    return self.o_proj(_rope_and_attend(self, positions, q, k, v, kv_cache, meta))


def _rope_and_attend(self: nn.Module, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """A LlamaAttention's q/k head norms (Qwen3, Gemma 3), RoPE, KV store and attention over the cache (its layer's
    window and sinks): q [T, Hq*D] -> [T, Hq*D]; one kernel when every sequence brings one token, two otherwise."""
    rotary, attn = self.rotary, self.attn
    if rotary.rotary_dim != rotary.head_dim:  # partial rotation (Phi-4-mini): the eager RoPE, then the backend
        q, k = rotary(positions, *self.head_norms(q, k))
        return attn(q, k, v, kv_cache, meta, self.sinks)
    norms = None if self.q_norm is None else (self.q_norm, self.k_norm)  # inside the RoPE kernels
    kv_scales = cache_scales(attn.kv_scales, kv_cache)
    if meta.decode is None and meta.is_decode_only:
        return rope_decode_attention(positions, q, k, v, rotary.cos_cache, rotary.sin_cache, kv_cache, meta,
                                     attn.scale, attn.window, self.sinks, norms, kv_scales)
    q = rope_store_kv(positions, q, k, v, rotary.cos_cache, rotary.sin_cache, rotary.head_dim, kv_cache,
                      meta.step_slots(), norms, kv_scales)
    return attend_over_cache(q.view(q.shape[0], attn.num_heads, attn.head_dim), kv_cache, meta,
                             attn.scale, attn.window, self.sinks, kv_scales).view(q.shape)


def _swiglu_forward(self: nn.Module, x: torch.Tensor | Fp8Rows) -> torch.Tensor:
    gate_up = self.gate_up_proj(x)
    fp8 = _fp8_buffers_for(self.down_proj, gate_up)
    return self.down_proj(_with_fp8(silu_and_mul(gate_up, fp8), fp8))


def _fp8_buffers_for(linear: nn.Module | None, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Where `linear` (None: a module that reads its input otherwise, an experts layer) multiplies as many 16-bit
    rows as `x` has by FP8 weights and takes them quantized already (Linear.takes_fp8_rows): buffers for the E4M3 form
    of its input, for the kernel that writes that input. One row: the GEMV reads the 16-bit activations as they are."""
    if linear is None or x.shape[0] < 2 or x.dtype not in (torch.bfloat16, torch.float16) or not linear.takes_fp8_rows:
        return None
    return fp8_buffers(x.shape[0], linear.in_features, x.device)


def _with_fp8(rows: torch.Tensor, fp8: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor | Fp8Rows:
    """A projection's input as it reaches the projection: with its E4M3 form where the kernel wrote one."""
    return rows if fp8 is None else Fp8Rows(rows, *fp8)


def _llama_forward(self: nn.Module, input_ids: torch.Tensor, positions: torch.Tensor,
                   kv_caches: list[torch.Tensor], meta: object) -> torch.Tensor:
    """LlamaModel.forward with every residual add inside the next RMSNorm (the decoder layers' own
    forward is the same computation, unfused), which also quantizes its rows where an FP8 q/k/v or gate/up
    projection reads them (LlamaAttention and LlamaMLP read their input only through that projection)."""
    from runtime.native.models.llama import LlamaMLP

    layers = self.layers
    x = self.embed(input_ids)
    if kv_caches and _gemv_step(self, x.shape[0]):
        return _one_token_forward(self, x, positions, kv_caches, meta)
    norm = layers[0].input_layernorm
    fp8 = _fp8_buffers_for(layers[0].self_attn.qkv_proj, x)
    normed = _with_fp8(rms_norm(x, norm.weight, norm.eps, norm.offset, norm.weight_in_float32, fp8), fp8)
    for i, layer in enumerate(layers):
        if i in self.kept_inputs:
            self.layer_inputs[i] = x
        h = layer.self_attn(positions, normed, kv_caches[i] if kv_caches else None, meta)
        post = layer.post_attention_layernorm
        fp8 = _fp8_buffers_for(layer.mlp.gate_up_proj if isinstance(layer.mlp, LlamaMLP) else None, x)
        x, rows = add_rms_norm(x, h, post.weight, post.eps, post.offset, post.weight_in_float32, fp8)
        h = layer.mlp(_with_fp8(rows, fp8))
        last = i + 1 == len(layers)
        nxt = self.norm if last else layers[i + 1].input_layernorm
        fp8 = None if last else _fp8_buffers_for(layers[i + 1].self_attn.qkv_proj, x)
        x, rows = add_rms_norm(x, h, nxt.weight, nxt.eps, nxt.offset, nxt.weight_in_float32, fp8)
        normed = _with_fp8(rows, fp8)
    return rows


def one_token_projections(model: nn.Module) -> bool:
    """Can a one-token step of this Llama model run its projections as fused GEMVs (runtime/native/cuda/gemv.py)? In
    16-bit dtypes (float32 models keep cuBLAS, whose sums the float32 references match), Llama's RMSNorm (the
    GEMV's prologue), SwiGLU MLPs (or experts, which run their own one-token kernel), no LoRA, no INT4 weights."""
    from runtime.native.models.llama import LlamaMLP

    if current().size > 1:  # the GEMVs would skip the row-parallel projections' all-reduce (and fold the residual in)
        return False
    first = model.layers[0]
    norm = first.input_layernorm
    if norm.weight.dtype not in (torch.bfloat16, torch.float16) or norm.offset or norm.weight_in_float32:
        return False
    dense = [layer.mlp for layer in model.layers if isinstance(layer.mlp, LlamaMLP)]
    if any(mlp.act is not F.silu for mlp in dense):
        return False
    linears = [linear for layer in model.layers for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj)]
    return all(linear.delta is None and linear.qweight is None  # INT4 weights: their own GEMV (Linear.base)
               for linear in linears + [m.gate_up_proj for m in dense] + [m.down_proj for m in dense])


def _gemv_step(model: nn.Module, tokens: int) -> bool:
    """Whether a step of `tokens` tokens runs its projections as GEMVs (_one_token_forward): one token where
    one_token_projections allows; up to MAX_TOKENS where, besides, every layer is dense (an experts layer's kernels
    take one token) and every projection's tile holds that many tokens' accumulators (takes_tokens; the model's
    shapes decide, so it is asked once per count). Each token of a GEMV call has the bits of its own call, so a
    sequence's verification rows (one-token rows of a decode graph: runtime/native/cuda/graphs.py) sum as its
    one-token steps do, and greedy speculation equals plain greedy decoding in 16 bits too."""
    from runtime.native.models.llama import LlamaMLP

    if not one_token_projections(model):
        return False
    if tokens == 1:
        return True
    if tokens > MAX_TOKENS:
        return False
    fits = model.__dict__.setdefault("_gemv_fits", {})  # tokens -> whether every projection takes them
    if tokens not in fits:
        weights = [linear.weight for layer in model.layers if isinstance(layer.mlp, LlamaMLP)
                   for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
                                  layer.mlp.down_proj)]
        fits[tokens] = len(weights) == 4 * len(model.layers) and all(takes_tokens(w, tokens) for w in weights)
    return fits[tokens]


def _one_token_forward(self: nn.Module, x: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                       meta: AttentionMetadata) -> torch.Tensor:
    """_llama_forward for one token (or a few: _gemv_step): four GEMV kernels a layer carry its RMSNorms, SwiGLU and
    residual adds (an experts layer, one token: the router's GEMV, the routing and two expert kernels,
    runtime/native/cuda/one_token_moe.py)."""
    from runtime.native.models.llama import LlamaMLP

    for i, layer in enumerate(self.layers):
        if i in self.kept_inputs:
            self.layer_inputs[i] = x
        attn, mlp = layer.self_attn, layer.mlp
        qkv = _normed_project(attn.qkv_proj, x, layer.input_layernorm)
        out = _rope_and_attend(attn, positions, *attn.qkv_proj.split(qkv), kv_caches[i], meta)
        x = _project(attn.o_proj, out, residual=x)
        norm = layer.post_attention_layernorm
        if not isinstance(mlp, LlamaMLP):
            x = one_token_moe(mlp, x, norm)
            continue
        h = _normed_project(mlp.gate_up_proj, x, norm, glu=True)
        x = _project(mlp.down_proj, h, residual=x)
    return rms_norm(x, self.norm.weight, self.norm.eps)


def _normed_project(linear: nn.Module, x: torch.Tensor, norm: nn.Module, **fused: Any) -> torch.Tensor:
    """`linear` on RMSNorm `norm` of x: in the GEMV's prologue (each program computes 1 / rms), or, for FP8 weights,
    by the norm kernel before the GEMV: their narrow tiles make ~1,800 programs of the 8B's gate/up, each paying the
    prologue (graphed 8B FP8 step 2.627 -> 2.596 ms, the 1B FP8 step equal; the same for 16-bit weights made the 1B's
    step 1.2% and Qwen3-30B-A3B's 2.6% slower: H200, benchmarks/RESULTS.md, 2026-11-30)."""
    if linear.weight_scale is not None:
        return _project(linear, rms_norm(x, norm.weight, norm.eps, pdl=pdl.ENABLED), **fused)
    return _project(linear, x, norm=(norm.weight, norm.eps), **fused)


def _project(linear: nn.Module, x: torch.Tensor, **fused: Any) -> torch.Tensor:
    """One token through `linear` as a GEMV with the fused prologue/epilogue `fused` (its FP8 row scales if any)."""
    return gemv(x, linear.weight, linear.bias, scale=linear.weight_scale, pdl=pdl.ENABLED, **fused)


def _compute_logits(self: nn.Module, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """CausalLM.compute_logits, with one 16-bit row (or a few, where the step's projections ran as GEMVs: _gemv_step)
    through the GEMV kernel: it writes the float32 logits itself (no cast pass), reads the 128k-row output embedding
    of a Llama-3 faster than cuBLAS does, and gives each row the bits it gets alone (verification rows pick what
    one-token steps pick)."""
    weight = self.output_embedding()
    rows = hidden.shape[0]
    if (rows > MAX_TOKENS or not takes_tokens(weight, rows) or (rows > 1 and not _several_rows_as_gemvs(self, rows))
            or weight.dtype not in (torch.bfloat16, torch.float16) or hidden.stride(-1) != 1
            or self.spec.final_logit_softcap):
        return type(self).compute_logits(self, hidden, out)
    if out is None:
        out = torch.empty((rows, weight.shape[0]), dtype=torch.float32, device=weight.device)
    return gemv(hidden, weight, pdl=pdl.ENABLED, out=out)


def _several_rows_as_gemvs(model: nn.Module, rows: int) -> bool:
    """Whether the CausalLM `model`'s step of `rows` rows ran its projections as GEMVs (_gemv_step), so its logits go
    through them too (where the step took cuBLAS, cuBLAS was the faster for the logits too: H200, 2026-11-29)."""
    inner = getattr(model, "model", None)
    return getattr(getattr(inner, "forward", None), "__func__", None) is _llama_forward and _gemv_step(inner, rows)


def use_fused_kernels(model: nn.Module) -> int:
    """Route RMSNorm, Llama attention's RoPE and KV store, and SwiGLU MLP modules of `model` through the kernels
    above, Llama models' residual adds into their RMSNorms, and one-token logits through the GEMV kernel; returns
    the count of modules changed."""
    from runtime.native.models.base import CausalLM
    from runtime.native.models.llama import LlamaAttention, LlamaMLP, LlamaModel
    from runtime.native.models.norm import RMSNorm

    count = 0
    if isinstance(model, CausalLM) and current().size == 1:  # (split logits are gathered: CausalLM's own)
        model.compute_logits = types.MethodType(_compute_logits, model)
    for module in model.modules():
        if isinstance(module, LlamaModel) and len(module.layers) and module.layers[0].pre_feedforward_layernorm is None:
            module.forward = types.MethodType(_llama_forward, module)  # (not with Gemma's norms around the MLP)
        elif isinstance(module, RMSNorm):
            module.forward = types.MethodType(_rms_norm_forward, module)
        elif isinstance(module, LlamaAttention):
            module.forward = types.MethodType(_llama_attention_forward, module)
        elif isinstance(module, LlamaMLP) and module.act is F.silu:
            module.forward = types.MethodType(_swiglu_forward, module)
        else:
            continue
        count += 1
    return count
