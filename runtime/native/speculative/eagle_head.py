"""The EAGLE head: one decoder layer over (the target's hidden state, the next token's embedding).

At index t the head reads h_t (the target's final-normed hidden state there) and e(x_{t+1}) (the target's
embedding, shared), mixes them with fc, runs one Llama decoder layer and the final norm; the result o_t goes
through the target's lm_head (shared) to predict x_{t+2}, and is the hidden state of the next chained step.

Chained drafting from a verified index n: step 1 reads (h_n, e(x_{n+1})), step j+1 reads (o of step j, e(draft j))
at index n+j. Its attention sees the head's entries for the verified indices (computed from the target's hidden
states) and its own earlier chain steps. Training and the acceptance metric unroll that exactly over every start n
at once ("training-time test"): pass u holds chain step u+1 of the chain started at n = t-u, at index t, and
attends to pass 0 at indices <= t-u and to pass j at index t-u+j (j = 1..u). The engine runs the same
weights one sequence at a time over a dense KV cache of its own (`extend`; eagle.py).
Trained by tools/demo_training/train_default_eagle.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE (the rotate-half layout of Llama checkpoints) on [B, heads, T, D]."""
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-b, a], dim=-1) * sin


def after_cache(past: int, length: int, device: torch.device) -> torch.Tensor | None:
    """The [T, past + T] mask of T new indices: every cached index, and causally each other (None for one index,
    which sees every key: no mask to build and apply)."""
    if length == 1:
        return None
    mask = torch.ones(length, past + length, dtype=torch.bool, device=device)
    mask[:, past:] = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    return mask


# not cuDNN's: it builds a plan for every new key length, and a drafting sequence's grows by one each step (23 ms of
# host a call on an H200, 2026-11-29: EAGLE ran at 0.03x of plain decoding)
_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Attention of q [B, heads, T, D] over k, v [B, kv_heads, S, D]. Unmasked (one drafted index), SDPA reads the
    shared heads itself; with a mask (a catch-up, training) the keys are repeated per query head, where SDPA's
    memory-efficient kernels run (with enable_gqa a masked call falls back to the plain math)."""
    group = q.shape[1] // k.shape[1]
    with sdpa_kernel(_BACKENDS):
        if mask is None or group == 1:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=group > 1)
        return F.scaled_dot_product_attention(q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1),
                                              attn_mask=mask)


def cached_rope(head: nn.Module, length: int, device: torch.device, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """`head.rope(length, ...)` from a table kept on the head and grown in powers of two: drafting asks for it at
    every chain step, and computing it afresh cost ten kernels and a pass over every position each time."""
    table = getattr(head, "_rope_table", None)
    if table is None or table[0].shape[0] < length or table[0].device != device or table[0].dtype != dtype:
        table = head.rope(max(64, 1 << (length - 1).bit_length()), device, dtype)
        head._rope_table = table
    return table[0][:length], table[1][:length]


def chain_mask(length: int, passes: int, device: torch.device) -> list[torch.Tensor]:
    """For each pass u, the boolean [T, (u+1) T] mask of the keys its query at index t may see (module docstring)."""
    t = torch.arange(length, device=device)
    masks = []
    for u in range(passes):
        parts = [t[None, :] <= (t[:, None] - u)]
        parts += [t[None, :] == (t[:, None] - u + j) for j in range(1, u + 1)]
        masks.append(torch.cat(parts, dim=1))
    return masks


class EagleHead(nn.Module):
    """fc (2H -> H), one pre-norm Llama decoder layer, final norm; checkpoint names as in the engine's loader."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, eps: float,
                 rope_theta: float) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.eps = heads, kv_heads, head_dim, eps
        self.rope_theta = rope_theta
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.input_layernorm = nn.Parameter(torch.ones(hidden))
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.post_attention_layernorm = nn.Parameter(torch.ones(hidden))
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.norm = nn.Parameter(torch.ones(hidden))

    def config(self) -> dict[str, object]:
        return {"architectures": ["EagleHead"], "hidden_size": self.fc.out_features,
                "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
                "intermediate_size": self.gate_proj.out_features, "rms_norm_eps": self.eps,
                "rope_theta": self.rope_theta}

    def rope(self, length: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        inv = 1.0 / self.rope_theta ** (torch.arange(0, self.head_dim, 2, device=device).float() / self.head_dim)
        angles = torch.arange(length, device=device).float()[:, None] * inv[None, :]
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def layer(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              mask: torch.Tensor | None) -> torch.Tensor:
        """The rest of the decoder layer after q, k, v ([B, heads / kv_heads, T, D], roped): attention, o_proj, MLP,
        final norm."""
        batch, length = x.shape[0], x.shape[1]
        attn = grouped_attention(q, k, v, mask)
        x = x + self.o_proj(attn.transpose(1, 2).reshape(batch, length, -1))
        h = rms_norm(x, self.post_attention_layernorm, self.eps)
        x = x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))
        return rms_norm(x, self.norm, self.eps)

    def qkv(self, hidden: torch.Tensor, embeds: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(fc's output x [B, T, H], roped q, roped k, v [B, heads, T, D]) of T indices."""
        batch, length, _ = hidden.shape
        x = self.fc(torch.cat([embeds.to(hidden.dtype), hidden], dim=-1))
        h = rms_norm(x, self.input_layernorm, self.eps)
        q = self.q_proj(h).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        return x, rotate(q, cos, sin), rotate(k, cos, sin), v

    aux_layers: tuple[int, ...] = ()  # the target hands its final hidden state (EAGLE-3 heads: eagle3.py)

    def feature(self, hidden: torch.Tensor) -> torch.Tensor:
        """What the head stores per position from the target's hidden state: the state itself."""
        return hidden

    def logits(self, out: torch.Tensor, target: torch.nn.Module) -> torch.Tensor:
        """Logits over the target's vocabulary: the target's head (shared)."""
        return target.compute_logits(out)  # type: ignore[operator]

    def embed(self, ids: torch.Tensor, target: torch.nn.Module) -> torch.Tensor:
        return target.model.embed(ids)  # type: ignore[union-attr,operator]

    def extend(self, hidden: torch.Tensor, embeds: torch.Tensor, start: int, past_k: torch.Tensor,
               past_v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One sequence's next T indices from `start` ([T, H] each), attending to the cache ([kv_heads, start', D]
        for the indices before, which may begin later than 0) and causally to themselves: (outputs [T, H] for the
        logits, the hidden states the next chain step reads (the same here), their k and v [kv_heads, T, D])."""
        length = hidden.shape[0]
        cos, sin = cached_rope(self, start + length, hidden.device, hidden.dtype)
        x, q, k, v = self.qkv(hidden[None], embeds[None], cos[start:], sin[start:])
        mask = after_cache(past_k.shape[1], length, hidden.device)
        out = self.layer(x, q, torch.cat([past_k[None], k], dim=2), torch.cat([past_v[None], v], dim=2), mask)
        return out[0], out[0], k[0], v[0]

    def unrolled(self, hidden: torch.Tensor, embeds: torch.Tensor, passes: int) -> list[torch.Tensor]:
        """The head's output hidden states [B, T, H] of each pass (module docstring): `hidden` [B, T, H] is the
        target's at each index, `embeds` [B, T, H] the embedding of the token after it."""
        length = hidden.shape[1]
        cos, sin = self.rope(length, hidden.device, hidden.dtype)
        masks = chain_mask(length, passes, hidden.device)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        outs: list[torch.Tensor] = []
        feed = hidden
        for u in range(passes):
            if u:  # chain step u+1 at index t reads step u's output at index t-1
                feed = torch.cat([torch.zeros_like(outs[-1][:, :1]), outs[-1][:, :-1]], dim=1)
            x, q, k, v = self.qkv(feed, embeds, cos, sin)
            keys.append(k)
            values.append(v)
            outs.append(self.layer(x, q, torch.cat(keys, dim=2), torch.cat(values, dim=2), masks[u]))
        return outs
