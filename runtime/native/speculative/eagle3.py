"""EAGLE-3 heads in their published checkpoint layout (Llama-3.x targets), run by eagle.py's proposer.

Layout (config.json architectures LlamaForCausalLMEagle3 / Eagle3LlamaForCausalLM): `fc` [H, 3 target H] over the
inputs of three target layers (eagle_config.eagle_aux_hidden_state_layer_ids, else 2, N/2 and N-3); one
`midlayer` whose attention reads [input_layernorm(embedding), hidden_norm(hidden)] (2H wide) and keeps `hidden` as
the residual; `norm`; `lm_head` over a draft vocabulary of draft_vocab_size ids, mapped to the target's by
`d2t` (target id = draft id + d2t[draft id]; `t2d` is the inverse mask, unused here); `embed_tokens` where the
checkpoint has one, else the target's. A chain step reads the previous step's hidden state before `norm`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from runtime.native.speculative.eagle_head import after_cache, cached_rope, grouped_attention, rms_norm, rotate

EAGLE3_ARCHITECTURES = {"LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"}


class Eagle3Head(nn.Module):
    """One EAGLE-3 head (see the module docstring); the same interface as eagle_head.EagleHead."""

    def __init__(self, config: dict[str, Any], aux_layers: tuple[int, ...], target_hidden: int) -> None:
        super().__init__()
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        self.heads, self.kv_heads = heads, int(config.get("num_key_value_heads", heads))
        self.head_dim = int(config.get("head_dim") or hidden // heads)
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) not in ("default", "llama3"):
            raise ValueError(f"EAGLE-3 head: rope type {rope.get('rope_type')!r} is not supported")
        self.rope_theta = float(rope.get("rope_theta") or config.get("rope_theta", 10000.0))
        self.rope_scaling = rope if rope.get("rope_type", rope.get("type")) == "llama3" else None
        self.aux_layers = aux_layers
        inter = int(config["intermediate_size"])
        draft_vocab = int(config.get("draft_vocab_size") or config["vocab_size"])
        self.fc = nn.Linear(3 * target_hidden, hidden, bias=False)
        self.input_layernorm = nn.Parameter(torch.ones(hidden))
        self.hidden_norm = nn.Parameter(torch.ones(hidden))
        self.q_proj = nn.Linear(2 * hidden, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * hidden, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * hidden, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)
        self.post_attention_layernorm = nn.Parameter(torch.ones(hidden))
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.norm = nn.Parameter(torch.ones(hidden))
        self.lm_head = nn.Linear(hidden, draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))
        self.embed_tokens: nn.Embedding | None = None

    @classmethod
    def load(cls, folder: Path, config: dict[str, Any], target_layers: int, dtype: torch.dtype,
             device: torch.device) -> Eagle3Head:
        from safetensors.torch import load_file

        eagle = config.get("eagle_config") or {}
        aux = tuple(eagle.get("eagle_aux_hidden_state_layer_ids") or (2, target_layers // 2, target_layers - 3))
        if len(aux) != 3 or not all(0 <= i < target_layers for i in aux):
            raise ValueError(f"EAGLE-3 head {folder}: auxiliary layers {aux} do not fit a {target_layers}-layer target")
        tensors: dict[str, torch.Tensor] = {}
        for file in sorted(folder.glob("*.safetensors")):
            tensors.update(load_file(str(file)))
        if not tensors:
            raise ValueError(f"EAGLE-3 head {folder}: no .safetensors weights")
        state = {}
        for name, t in tensors.items():
            name = name.removeprefix("model.")
            name = name.replace("midlayer.self_attn.", "").replace("midlayer.mlp.", "").replace("midlayer.", "")
            state[name.removesuffix(".weight") if name.endswith("norm.weight") else name] = t
        state.pop("t2d", None)
        target_hidden = int(config.get("target_hidden_size") or state["fc.weight"].shape[1] // 3)
        head = cls(config, aux, target_hidden)
        if "embed_tokens.weight" in state:
            head.embed_tokens = nn.Embedding(*state["embed_tokens.weight"].shape)
        state.setdefault("d2t", torch.zeros(head.lm_head.out_features, dtype=torch.long))
        missing, unexpected = head.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"EAGLE-3 head {folder}: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
        return head.to(device=device, dtype=dtype).eval()

    def rope(self, length: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        inv = 1.0 / self.rope_theta ** (torch.arange(0, self.head_dim, 2, device=device).float() / self.head_dim)
        if self.rope_scaling is not None:  # Llama 3.1's frequency bands
            s = self.rope_scaling
            factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
            old = float(s["original_max_position_embeddings"])
            wavelen = 2 * torch.pi / inv
            smooth = ((old / wavelen - low) / (high - low)).clamp(0, 1)
            scaled = torch.where(wavelen > old / low, inv / factor, inv)
            inv = torch.where((wavelen <= old / low) & (wavelen >= old / high),
                              (1 - smooth) * inv / factor + smooth * inv, scaled)
        angles = torch.arange(length, device=device).float()[:, None] * inv[None, :]
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def feature(self, aux: torch.Tensor) -> torch.Tensor:
        """fc over the three target layers' inputs ([T, 3 target H] -> [T, H])."""
        return self.fc(aux.to(self.fc.weight.dtype))

    def embed(self, ids: torch.Tensor, target: nn.Module) -> torch.Tensor:
        return self.embed_tokens(ids) if self.embed_tokens is not None else target.model.embed(ids)  # type: ignore

    def logits(self, out: torch.Tensor, target: nn.Module) -> torch.Tensor:
        """The draft vocabulary's logits placed at the target's ids (the others -inf)."""
        draft = self.lm_head(out).float()
        full = draft.new_full((draft.shape[0], target.spec.vocab_size), float("-inf"))  # type: ignore[union-attr]
        full[:, torch.arange(draft.shape[1], device=draft.device) + self.d2t] = draft
        return full

    def extend(self, hidden: torch.Tensor, embeds: torch.Tensor, start: int, past_k: torch.Tensor,
               past_v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """As EagleHead.extend: (normed outputs for the logits, the pre-norm states the next step reads, k, v)."""
        length = hidden.shape[0]
        cos, sin = cached_rope(self, start + length, hidden.device, hidden.dtype)
        x = torch.cat([rms_norm(embeds.to(hidden.dtype), self.input_layernorm, self.eps),
                       rms_norm(hidden, self.hidden_norm, self.eps)], dim=-1)[None]
        q = self.q_proj(x).view(1, length, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(1, length, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(1, length, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos[start:], sin[start:]), rotate(k, cos[start:], sin[start:])
        mask = after_cache(past_k.shape[1], length, hidden.device)
        keys, values = torch.cat([past_k[None], k], dim=2), torch.cat([past_v[None], v], dim=2)
        attn = grouped_attention(q, keys, values, mask)
        residual = hidden[None] + self.o_proj(attn.transpose(1, 2).reshape(1, length, -1))
        h = rms_norm(residual, self.post_attention_layernorm, self.eps)
        residual = residual + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))
        return rms_norm(residual, self.norm, self.eps)[0], residual[0], k[0], v[0]
