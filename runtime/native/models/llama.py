"""The Llama family and its descendants, one decoder whose differences are ModelSpec fields (spec.py):

- Llama 2/3, Mistral, Qwen2 (q/k/v bias), Phi-3/Phi-4 (checkpoints with fused qkv and gate_up: loaded whole into the
  same Linears; LongRoPE and partial rotation in rotary_embedding.py);
- Qwen3 (q/k RMSNorm per head), Gemma 3 (norms around attention and the MLP too, (1 + weight) norms, scaled
  embeddings, GeGLU, sliding and global layers with their own RoPE bases);
- mixture-of-experts MLPs in place of the dense one (moe.py): Mixtral, Qwen3-MoE, gpt-oss (with attention sinks).
RMSNorm, RoPE, grouped-query attention over the paged cache, gated MLP.

Under tensor parallelism (runtime/native/parallel/) each rank builds its share: its query heads and their KV heads
(q/k/v column-parallel, o_proj row-parallel), its slice of the MLP's intermediate size (gate/up column-parallel,
down_proj row-parallel), its slice of the vocabulary (embedding and lm_head): one all-reduce after attention and one
after the MLP, inside the row-parallel Linears.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from runtime.native.attention_metadata import AttentionMetadata
from runtime.model_spec import ModelSpec
from runtime.native.models.activation import get_activation
from runtime.native.models.attention import Attention
from runtime.native.models.base import CausalLM
from runtime.native.models.embedding import Embedding
from runtime.native.models.linear import Linear, Shard
from runtime.native.models.moe import MoE, expert_target
from runtime.native.models.norm import RMSNorm
from runtime.native.models.rotary_embedding import RopeConfig, RotaryEmbedding
from runtime.native.parallel.group import current

# checkpoint name prefixes -> ours: Gemma 3's multimodal checkpoints (transformers 5 and 4 spellings) keep their text
# model under language_model; Mixtral's MoE block is "block_sparse_moe"; gpt-oss's router is "router"
_RENAMES = ((re.compile(r"^model\.language_model\."), "model."), (re.compile(r"^language_model\.model\."), "model."),
            (re.compile(r"^language_model\.lm_head\."), "lm_head."), (re.compile(r"\.block_sparse_moe\."), ".mlp."),
            (re.compile(r"\.mlp\.router\."), ".mlp.gate."))
# what a multimodal checkpoint holds besides its text model (we serve text only)
_NOT_TEXT = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


def rms_norm(spec: ModelSpec, dim: int, dtype: torch.dtype) -> RMSNorm:
    """An RMSNorm with the model's convention and epsilon."""
    return RMSNorm(dim, float(spec.config.get("rms_norm_eps", 1e-6)), dtype=dtype, offset=spec.norm_offset,
                   weight_in_float32=spec.norm_weight_in_float32)


class LlamaAttention(nn.Module):
    """Fused q/k/v projection (parts "q_proj", "k_proj", "v_proj"), optional q/k head norms, RoPE, paged attention
    (the layer's sliding window, attention sinks where the model has them), o_proj."""

    def __init__(self, spec: ModelSpec, rotary: RotaryEmbedding, dtype: torch.dtype, layer: int) -> None:
        super().__init__()
        tp, d = current(), spec.head_dim
        first_head, heads = tp.share(spec.num_heads, "attention heads")
        first_kv, kv_heads = tp.kv_heads(spec.num_kv_heads)
        q_size, kv_size = heads * d, kv_heads * d
        qkv_shard = o_shard = None
        if tp.size > 1:
            full_kv = spec.num_kv_heads * d
            qkv_shard = Shard(rows=((first_head * d, q_size), (first_kv * d, kv_size), (first_kv * d, kv_size)),
                              full_rows=(spec.num_heads * d, full_kv, full_kv))
            o_shard = Shard(cols=(first_head * d, q_size), full_cols=spec.num_heads * d)
        self.qkv_proj = Linear(spec.hidden_size, [("q_proj", q_size), ("k_proj", kv_size), ("v_proj", kv_size)],
                               bias=spec.qkv_bias, dtype=dtype, shard=qkv_shard)
        self.o_proj = Linear(q_size, [("o_proj", spec.hidden_size)], bias=spec.o_bias, dtype=dtype, shard=o_shard)
        self.q_norm = rms_norm(spec, spec.head_dim, dtype) if spec.qk_norm else None
        self.k_norm = rms_norm(spec, spec.head_dim, dtype) if spec.qk_norm else None
        self.sinks = nn.Parameter(torch.empty(heads, dtype=dtype), requires_grad=False) \
            if spec.attention_sinks else None
        self.tp_slices = {"sinks": (0, first_head, heads)}  # (dim, start, length) of checkpoint tensors (loader.py)
        self.rotary = rotary  # one module shared by the layers of a type (it has no weights)
        self.attn = Attention(heads, kv_heads, spec.head_dim, scale=spec.attention_scale,
                              window=spec.layer_windows[layer])

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, kv_cache: torch.Tensor | None, meta: AttentionMetadata
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        q, k = self.head_norms(q, k)
        q, k = self.rotary(positions, q, k)
        return self.o_proj(self.attn(q, k, v, kv_cache, meta, self.sinks))

    def head_norms(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k with each head RMS-normalised (Qwen3, Gemma 3), unchanged elsewhere."""
        if self.q_norm is None or self.k_norm is None:
            return q, k
        tokens, dim = q.shape[0], self.attn.head_dim
        return (self.q_norm(q.reshape(tokens, -1, dim)).view(tokens, -1),
                self.k_norm(k.reshape(tokens, -1, dim)).view(tokens, -1))


class LlamaMLP(nn.Module):
    """Gated MLP: down(act(gate(x)) * up(x)) with gate and up fused into one matmul (SwiGLU; GeGLU for Gemma)."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype) -> None:
        super().__init__()
        full = int(spec.config["intermediate_size"])
        start, inter = current().share(full, "MLP intermediate size")
        bias = bool(spec.config.get("mlp_bias", False))
        up_shard = down_shard = None
        if current().size > 1:
            up_shard = Shard(rows=((start, inter), (start, inter)), full_rows=(full, full))
            down_shard = Shard(cols=(start, inter), full_cols=full)
        self.gate_up_proj = Linear(spec.hidden_size, [("gate_proj", inter), ("up_proj", inter)], bias=bias, dtype=dtype,
                                   shard=up_shard)
        self.down_proj = Linear(inter, [("down_proj", spec.hidden_size)], bias=bias, dtype=dtype, shard=down_shard)
        self.act = get_activation(spec.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.split(self.gate_up_proj(x))
        return self.down_proj(self.act(gate) * up)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x)); with sandwich norms (Gemma 3) each
    branch's output is normalised too before it joins the residual stream."""

    def __init__(self, spec: ModelSpec, rotary: RotaryEmbedding, dtype: torch.dtype, layer: int) -> None:
        super().__init__()
        self.input_layernorm = rms_norm(spec, spec.hidden_size, dtype)
        self.self_attn = LlamaAttention(spec, rotary, dtype, layer)
        self.post_attention_layernorm = rms_norm(spec, spec.hidden_size, dtype)
        moe = spec.moe
        self.mlp: nn.Module = MoE(moe, spec, dtype) if moe is not None and moe.sparse_layers[layer] \
            else LlamaMLP(spec, dtype)
        self.pre_feedforward_layernorm = rms_norm(spec, spec.hidden_size, dtype) if spec.sandwich_norms else None
        self.post_feedforward_layernorm = rms_norm(spec, spec.hidden_size, dtype) if spec.sandwich_norms else None

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, kv_cache: torch.Tensor | None, meta: AttentionMetadata
    ) -> torch.Tensor:
        if self.pre_feedforward_layernorm is None or self.post_feedforward_layernorm is None:
            x = x + self.self_attn(positions, self.input_layernorm(x), kv_cache, meta)
            return x + self.mlp(self.post_attention_layernorm(x))
        x = x + self.post_attention_layernorm(self.self_attn(positions, self.input_layernorm(x), kv_cache, meta))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class LlamaModel(nn.Module):
    """Embedding, decoder layers, final norm (checkpoint prefix "model.")."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = Embedding(spec.vocab_size, spec.hidden_size, dtype=dtype)
        # Gemma multiplies embeddings by sqrt(hidden) rounded to the weights' dtype, as transformers does
        self.embed_scale = spec.hidden_size**0.5 if spec.embedding_scaled else None
        full, local = (RopeConfig.from_config(spec.config, kind) for kind in ("full_attention", "sliding_attention"))
        self.rotary_emb = RotaryEmbedding(spec.head_dim, spec.max_position_embeddings, full, spec.context_window)
        # sliding layers get their own RoPE where the config gives them one (Gemma 3's local base frequency)
        self.local_rotary_emb = self.rotary_emb if local == full else RotaryEmbedding(
            spec.head_dim, spec.max_position_embeddings, local, spec.context_window)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(spec, self.rotary_emb if window is None else self.local_rotary_emb, dtype, i)
            for i, window in enumerate(spec.layer_windows))
        self.norm = rms_norm(spec, spec.hidden_size, dtype)
        # layers whose input (the residual stream before them) each forward keeps in `layer_inputs`: what an EAGLE-3
        # head reads (runtime/native/speculative/eagle3.py); every forward (eager, and the fused CUDA ones) keeps them
        self.kept_inputs: frozenset[int] = frozenset()
        self.layer_inputs: dict[int, torch.Tensor] = {}

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        return x if self.embed_scale is None else x * torch.tensor(self.embed_scale, dtype=x.dtype)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor], meta: AttentionMetadata
    ) -> torch.Tensor:
        x = self.embed(input_ids)
        for i, layer in enumerate(self.layers):
            if i in self.kept_inputs:
                self.layer_inputs[i] = x
            x = layer(positions, x, kv_caches[i] if kv_caches else None, meta)
        return self.norm(x)


class LlamaForCausalLM(CausalLM):
    """The causal LM of every family in the module docstring (the registry maps their architectures here)."""

    packed_modules = {
        "q_proj": ("qkv_proj", "q_proj"),
        "k_proj": ("qkv_proj", "k_proj"),
        "v_proj": ("qkv_proj", "v_proj"),
        "gate_proj": ("gate_up_proj", "gate_proj"),
        "up_proj": ("gate_up_proj", "up_proj"),
    }
    ignored_checkpoint_names = ("rotary_emb.inv_freq",)
    tensor_parallel = True

    def __init__(self, spec: ModelSpec, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(spec)
        self.model = LlamaModel(spec, dtype)
        self.tie_word_embeddings = bool(spec.config.get("tie_word_embeddings", False))
        tp = current()
        start, read, held = tp.vocab_share(spec.vocab_size)  # vocabulary-parallel under tensor parallelism
        self.lm_head = None if self.tie_word_embeddings else Linear(
            spec.hidden_size, [("lm_head", held)], dtype=dtype,
            shard=Shard(rows=((start, read),), full_rows=(spec.vocab_size,)) if tp.size > 1 else None)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor], meta: AttentionMetadata
    ) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, meta)

    def output_embedding(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def checkpoint_target(self, name: str) -> tuple[str, str | None] | None:
        if name.startswith(_NOT_TEXT):
            return None
        for pattern, ours in _RENAMES:
            name = pattern.sub(ours, name)
        if name.startswith("lm_head.") and self.lm_head is None:
            return None  # tied: some checkpoints store a copy of the embedding anyway
        return expert_target(name) or super().checkpoint_target(name)
