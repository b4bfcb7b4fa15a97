"""Fused Triton kernels for the elementwise parts of a Llama layer on CUDA.

Why: at decode batch sizes a layer's matmuls take microseconds, and eager RMSNorm (8 kernels),
RoPE (18) and SwiGLU (2) launches cost as much again, even inside a CUDA graph. Each becomes one
kernel here, and each residual add joins the RMSNorm after it (Llama models run `_llama_forward`: two
kernels fewer per layer, 32 of a batch-1 step's 213 on the 1B shape, 1.2 us each on an H100), and RoPE
writes the rotated K and the V of each new token straight into its KV cache slot (one kernel fewer per
layer). They round intermediates to the activation dtype where the eager code does, so results match
the eager modules (runtime/models/norm.py, rotary_embedding.py, llama.py) up to the last bit of the
transcendental functions.

`use_fused_kernels(model)` swaps the `forward` of the matching module instances; model files stay
device-agnostic and the CPU path is untouched.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import nn

from runtime.attention_metadata import AttentionMetadata
from runtime.cuda.paged_attention import attend_over_cache


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride_x, stride_o, eps, N: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    h = (x * rstd).to(out_ptr.dtype.element_ty)  # cast back before the weight, as HF Llama
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride_o + offs, (w.to(tl.float32) * h.to(tl.float32)).to(out_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def _add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, sum_ptr, out_ptr, stride_x, stride_r, stride_s, stride_o, eps,
                         N: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    dtype = sum_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32)
    total = (x + r).to(dtype)  # the residual stream, rounded as the eager add rounds it
    tl.store(sum_ptr + row * stride_s + offs, total, mask=mask)
    t = total.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(t * t, axis=0) / N + eps)
    h = (t * rstd).to(dtype)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride_o + offs, (w.to(tl.float32) * h.to(tl.float32)).to(dtype), mask=mask)


@triton.jit
def _rope_rows(src_row, dst_row, cos, sin, heads, offs_h, offs_d, d_mask, HALF: tl.constexpr):
    """Rotate-half RoPE of one token's `heads` heads from src_row to dst_row (each head 2*HALF wide)."""
    dtype = dst_row.dtype.element_ty
    mask = (offs_h < heads)[:, None] & d_mask[None, :]
    base = offs_h[:, None] * (2 * HALF) + offs_d[None, :]
    x1 = tl.load(src_row + base, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src_row + base + HALF, mask=mask, other=0.0).to(tl.float32)
    # eager order of roundings: each product, then the sum, in the activation dtype
    o1 = (x1 * cos[None, :]).to(dtype).to(tl.float32) - (x2 * sin[None, :]).to(dtype).to(tl.float32)
    o2 = (x2 * cos[None, :]).to(dtype).to(tl.float32) + (x1 * sin[None, :]).to(dtype).to(tl.float32)
    tl.store(dst_row + base, o1.to(dtype), mask=mask)
    tl.store(dst_row + base + HALF, o2.to(dtype), mask=mask)


@triton.jit
def _cos_sin(pos_ptr, cos_ptr, sin_ptr, t, stride_cache, offs_d, d_mask, dtype):
    """The token's cos/sin rows, rounded to the activation dtype as the eager cache lookup is."""
    pos = tl.load(pos_ptr + t).to(tl.int64)
    cos = tl.load(cos_ptr + pos * stride_cache + offs_d, mask=d_mask, other=0.0).to(dtype).to(tl.float32)
    sin = tl.load(sin_ptr + pos * stride_cache + offs_d, mask=d_mask, other=0.0).to(dtype).to(tl.float32)
    return cos, sin


@triton.jit(do_not_specialize_on_alignment=["pos_ptr", "slot_ptr"])  # step metadata (runtime/cuda/paged_attention.py)
def _rope_store_kv_kernel(
    pos_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, qo_ptr, cache_ptr, slot_ptr, v_offset,
    stride_q, stride_k, stride_v, stride_cache,
    HQ: tl.constexpr, HK: tl.constexpr, BLOCK_H: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_ROW: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < HALF
    cos, sin = _cos_sin(pos_ptr, cos_ptr, sin_ptr, t, stride_cache, offs_d, d_mask, qo_ptr.dtype.element_ty)
    _rope_rows(q_ptr + t * stride_q, qo_ptr + t * HQ * 2 * HALF, cos, sin, HQ, offs_h, offs_d, d_mask, HALF)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:  # slot < 0: a padded row of a replayed graph, which stores nothing
        row = HK * 2 * HALF
        _rope_rows(k_ptr + t * stride_k, cache_ptr + slot * row, cos, sin, HK, offs_h, offs_d, d_mask, HALF)
        offs = tl.arange(0, BLOCK_ROW)
        v = tl.load(v_ptr + t * stride_v + offs, mask=offs < row)
        tl.store(cache_ptr + v_offset + slot * row + offs, v.to(cache_ptr.dtype.element_ty), mask=offs < row)


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, stride_x, I: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < I
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + I + offs, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * I + offs, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * (x / rms(x)) over the last dim, float32 inside; x [..., N]."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    n = x2.shape[-1]
    if x2.shape[0]:
        block = triton.next_power_of_2(n)
        _rms_norm_kernel[(x2.shape[0],)](x2, weight, out, x2.stride(0), out.stride(0), eps, N=n, BLOCK=block,
                                         num_warps=min(16, max(1, block // 256)))
    return out.view(x.shape)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, rms_norm(x + residual)) in one kernel; x and residual [T, N]."""
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = x.shape[-1]
    if x.shape[0]:
        block = triton.next_power_of_2(n)
        _add_rms_norm_kernel[(x.shape[0],)](x, residual, weight, total, out, x.stride(0), residual.stride(0),
                                            total.stride(0), out.stride(0), eps, N=n, BLOCK=block,
                                            num_warps=min(16, max(1, block // 256)))
    return total, out


def rope_store_kv(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  cos_cache: torch.Tensor, sin_cache: torch.Tensor, head_dim: int, kv_cache: torch.Tensor,
                  slot_mapping: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of packed q [T, Hq*D] and k [T, Hk*D] (rows may be strided views), then store_kv
    (runtime/cuda/paged_attention.py) in the same kernel: each token's rotated K and its V go straight to its
    cache slot (none for slot < 0); returns the rotated q [T, Hq*D]."""
    tokens = q.shape[0]
    hq, hk = q.shape[1] // head_dim, k.shape[1] // head_dim
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if tokens:
        _, num_blocks, block_size, _, _ = kv_cache.shape
        half = head_dim // 2
        _rope_store_kv_kernel[(tokens,)](
            positions, cos_cache, sin_cache, q, k, v, q_out, kv_cache, slot_mapping,
            num_blocks * block_size * hk * head_dim, q.stride(0), k.stride(0), v.stride(0), cos_cache.stride(0),
            HQ=hq, HK=hk, BLOCK_H=triton.next_power_of_2(max(hq, hk)), HALF=half,
            BLOCK_HALF=triton.next_power_of_2(half), BLOCK_ROW=triton.next_power_of_2(hk * head_dim),
        )
    return q_out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[:, :I]) * x[:, I:] for x [T, 2I]."""
    tokens, width = x.shape
    inter = width // 2
    out = torch.empty((tokens, inter), dtype=x.dtype, device=x.device)
    if tokens:
        block = 1024
        _silu_mul_kernel[(tokens, triton.cdiv(inter, block))](x, out, x.stride(0), I=inter, BLOCK=block)
    return out


def _rms_norm_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return rms_norm(x, self.weight, self.eps)


def _llama_attention_forward(self: nn.Module, positions: torch.Tensor, x: torch.Tensor, kv_cache: torch.Tensor | None,
                             meta: AttentionMetadata) -> torch.Tensor:
    """LlamaAttention.forward with RoPE and the KV store in one kernel (the attention backend then only attends)."""
    if kv_cache is None:  # the cache-less profiling pass: the eager modules
        return type(self).forward(self, positions, x, kv_cache, meta)
    q, k, v = self.qkv_proj.split(self.qkv_proj(x))
    rotary, attn = self.rotary, self.attn
    q = rope_store_kv(positions, q, k, v, rotary.cos_cache, rotary.sin_cache, rotary.head_dim, kv_cache,
                      meta.step_slots())
    out = attend_over_cache(q.view(q.shape[0], attn.num_heads, attn.head_dim), kv_cache, meta, attn.scale)
    return self.o_proj(out.view(q.shape))


def _swiglu_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


def _llama_forward(self: nn.Module, input_ids: torch.Tensor, positions: torch.Tensor,
                   kv_caches: list[torch.Tensor], meta: object) -> torch.Tensor:
    """LlamaModel.forward with every residual add inside the next RMSNorm (the decoder layers' own
    forward is the same computation, unfused)."""
    layers = self.layers
    x = self.embed_tokens(input_ids)
    normed = layers[0].input_layernorm(x)
    for i, layer in enumerate(layers):
        h = layer.self_attn(positions, normed, kv_caches[i] if kv_caches else None, meta)
        post = layer.post_attention_layernorm
        x, normed = add_rms_norm(x, h, post.weight, post.eps)
        h = layer.mlp(normed)
        following = layers[i + 1].input_layernorm if i + 1 < len(layers) else self.norm
        x, normed = add_rms_norm(x, h, following.weight, following.eps)
    return normed


def use_fused_kernels(model: nn.Module) -> int:
    """Route RMSNorm, Llama attention's RoPE and KV store, and SwiGLU MLP modules of `model` through the kernels
    above, and Llama models' residual adds into their RMSNorms; returns the count of modules changed."""
    from runtime.models.llama import LlamaAttention, LlamaMLP, LlamaModel
    from runtime.models.norm import RMSNorm

    count = 0
    for module in model.modules():
        if isinstance(module, LlamaModel) and len(module.layers):
            module.forward = types.MethodType(_llama_forward, module)
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
