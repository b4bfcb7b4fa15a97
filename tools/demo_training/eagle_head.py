"""The EAGLE head in its training form: one decoder layer over (the target's hidden state, the next token's embedding).

At index t the head reads h_t (the target's final-normed hidden state there) and e(x_{t+1}) (the target's
embedding, shared), mixes them with fc, runs one Llama decoder layer and the final norm; the result o_t goes
through the target's lm_head (shared) to predict x_{t+2}, and is the hidden state of the next chained step.

Chained drafting from a verified index n: step 1 reads (h_n, e(x_{n+1})), step j+1 reads (o of step j, e(draft j))
at index n+j. Its attention sees the head's entries for the verified indices (computed from the target's hidden
states) and its own earlier chain steps. Training and the acceptance metric unroll that exactly over every start n
at once ("training-time test"): pass u holds chain step u+1 of the chain started at n = t-u, at index t, and
attends to pass 0 at indices <= t-u and to pass j at index t-u+j (j = 1..u).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE (the rotate-half layout of Llama checkpoints) on [B, heads, T, D]."""
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-b, a], dim=-1) * sin


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

    @classmethod
    def from_target(cls, target: nn.Module) -> EagleHead:
        """A head shaped like a layer of the HF Llama `target`, initialised from its last layer and final norm,
        with fc passing the hidden state through (so the untrained head predicts what the target's next layer would)."""
        c = target.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        theta = (getattr(c, "rope_parameters", None) or {}).get("rope_theta") or getattr(c, "rope_theta", 10000.0)
        head = cls(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, head_dim, c.intermediate_size,
                   c.rms_norm_eps, float(theta)).to(target.device)
        last = target.model.layers[-1]
        with torch.no_grad():
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(head, name).weight.copy_(getattr(last.self_attn, name).weight)
            for name in ("gate_proj", "up_proj", "down_proj"):
                getattr(head, name).weight.copy_(getattr(last.mlp, name).weight)
            head.input_layernorm.copy_(last.input_layernorm.weight)
            head.post_attention_layernorm.copy_(last.post_attention_layernorm.weight)
            head.norm.copy_(target.model.norm.weight)
            hidden = c.hidden_size
            head.fc.weight.zero_()
            head.fc.weight[:, :hidden].normal_(std=0.02)  # the embedding's share starts small
            head.fc.weight[:, hidden:].copy_(torch.eye(hidden))
        return head

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

    def unrolled(self, hidden: torch.Tensor, embeds: torch.Tensor, passes: int) -> list[torch.Tensor]:
        """The head's output hidden states [B, T, H] of each pass (module docstring): `hidden` [B, T, H] is the
        target's at each index, `embeds` [B, T, H] the embedding of the token after it."""
        batch, length, _ = hidden.shape
        cos, sin = self.rope(length, hidden.device, hidden.dtype)
        masks = chain_mask(length, passes, hidden.device)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        outs: list[torch.Tensor] = []
        feed = hidden
        for u in range(passes):
            if u:  # chain step u+1 at index t reads step u's output at index t-1
                feed = torch.cat([torch.zeros_like(outs[-1][:, :1]), outs[-1][:, :-1]], dim=1)
            x = self.fc(torch.cat([embeds, feed], dim=-1))
            h = rms_norm(x, self.input_layernorm, self.eps)
            q = self.q_proj(h).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
            k = self.k_proj(h).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
            v = self.v_proj(h).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            keys.append(k)
            values.append(v)
            group = self.heads // self.kv_heads
            k_all = torch.cat(keys, dim=2).repeat_interleave(group, dim=1)
            v_all = torch.cat(values, dim=2).repeat_interleave(group, dim=1)
            attn = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=masks[u])
            x = x + self.o_proj(attn.transpose(1, 2).reshape(batch, length, -1))
            h = rms_norm(x, self.post_attention_layernorm, self.eps)
            x = x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))
            outs.append(rms_norm(x, self.norm, self.eps))
        return outs
