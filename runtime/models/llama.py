"""Llama family: Llama 2/3, Mistral, Qwen2 (q/k/v bias). RMSNorm, RoPE, grouped-query attention, SwiGLU."""

from __future__ import annotations

import torch
from torch import nn

from runtime.attention_metadata import AttentionMetadata
from runtime.models.activation import get_activation
from runtime.models.attention import Attention
from runtime.models.base import CausalLM
from runtime.models.embedding import Embedding
from runtime.models.linear import Linear
from runtime.models.norm import RMSNorm
from runtime.models.rotary_embedding import RopeConfig, RotaryEmbedding
from runtime.models.spec import ModelSpec


class LlamaAttention(nn.Module):
    """Fused q/k/v projection (parts "q_proj", "k_proj", "v_proj"), RoPE, paged attention, o_proj."""

    def __init__(self, spec: ModelSpec, rotary: RotaryEmbedding, dtype: torch.dtype) -> None:
        super().__init__()
        cfg = spec.config
        q_size = spec.num_heads * spec.head_dim
        kv_size = spec.num_kv_heads * spec.head_dim
        # Qwen2 always has q/k/v bias; Llama exposes it as "attention_bias"
        qkv_bias = bool(cfg.get("attention_bias", False)) or spec.architecture == "Qwen2ForCausalLM"
        self.qkv_proj = Linear(
            spec.hidden_size, [("q_proj", q_size), ("k_proj", kv_size), ("v_proj", kv_size)], bias=qkv_bias, dtype=dtype
        )
        o_bias = bool(cfg.get("attention_bias", False))
        self.o_proj = Linear(q_size, [("o_proj", spec.hidden_size)], bias=o_bias, dtype=dtype)
        self.rotary = rotary  # one module shared by all layers (it has no weights)
        self.attn = Attention(spec.num_heads, spec.num_kv_heads, spec.head_dim, scale=spec.head_dim**-0.5)

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, kv_cache: torch.Tensor | None, meta: AttentionMetadata
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        q, k = self.rotary(positions, q, k)
        return self.o_proj(self.attn(q, k, v, kv_cache, meta))


class LlamaMLP(nn.Module):
    """SwiGLU: down(act(gate(x)) * up(x)), with gate and up fused into one matmul."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype) -> None:
        super().__init__()
        cfg = spec.config
        inter = int(cfg["intermediate_size"])
        bias = bool(cfg.get("mlp_bias", False))
        self.gate_up_proj = Linear(spec.hidden_size, [("gate_proj", inter), ("up_proj", inter)], bias=bias, dtype=dtype)
        self.down_proj = Linear(inter, [("down_proj", spec.hidden_size)], bias=bias, dtype=dtype)
        self.act = get_activation(str(cfg.get("hidden_act", "silu")))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.split(self.gate_up_proj(x))
        return self.down_proj(self.act(gate) * up)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, spec: ModelSpec, rotary: RotaryEmbedding, dtype: torch.dtype) -> None:
        super().__init__()
        eps = float(spec.config.get("rms_norm_eps", 1e-6))
        self.input_layernorm = RMSNorm(spec.hidden_size, eps, dtype=dtype)
        self.self_attn = LlamaAttention(spec, rotary, dtype)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, eps, dtype=dtype)
        self.mlp = LlamaMLP(spec, dtype)

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, kv_cache: torch.Tensor | None, meta: AttentionMetadata
    ) -> torch.Tensor:
        x = x + self.self_attn(positions, self.input_layernorm(x), kv_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """Embedding, decoder layers, final norm (checkpoint prefix "model.")."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = Embedding(spec.vocab_size, spec.hidden_size, dtype=dtype)
        rope = RopeConfig.from_config(spec.config)
        self.rotary_emb = RotaryEmbedding(spec.head_dim, spec.max_position_embeddings, rope)
        self.layers = nn.ModuleList(LlamaDecoderLayer(spec, self.rotary_emb, dtype) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, float(spec.config.get("rms_norm_eps", 1e-6)), dtype=dtype)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor], meta: AttentionMetadata
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for i, layer in enumerate(self.layers):
            x = layer(positions, x, kv_caches[i] if kv_caches else None, meta)
        return self.norm(x)


class LlamaForCausalLM(CausalLM):
    """Llama / Mistral / Qwen2 causal LM. Mistral's sliding window is not applied: we serve contexts up to
    max_position_embeddings with full attention, which equals sliding-window attention while the
    sequence is no longer than the window (4096 or more in released checkpoints)."""

    packed_modules = {
        "q_proj": ("qkv_proj", "q_proj"),
        "k_proj": ("qkv_proj", "k_proj"),
        "v_proj": ("qkv_proj", "v_proj"),
        "gate_proj": ("gate_up_proj", "gate_proj"),
        "up_proj": ("gate_up_proj", "up_proj"),
    }
    ignored_checkpoint_names = ("rotary_emb.inv_freq",)

    def __init__(self, spec: ModelSpec, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(spec)
        self.model = LlamaModel(spec, dtype)
        self.tie_word_embeddings = bool(spec.config.get("tie_word_embeddings", False))
        self.lm_head = None if self.tie_word_embeddings else Linear(
            spec.hidden_size, [("lm_head", spec.vocab_size)], dtype=dtype
        )

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor], meta: AttentionMetadata
    ) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, meta)

    def output_embedding(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def checkpoint_target(self, name: str) -> tuple[str, str | None] | None:
        if name.startswith("lm_head.") and self.lm_head is None:
            return None  # tied: some checkpoints store a copy of the embedding anyway
        return super().checkpoint_target(name)
