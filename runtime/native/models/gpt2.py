"""GPT-2 (GPT2LMHeadModel): learned positions, LayerNorm, fused c_attn, GELU MLP, tied lm_head."""

from __future__ import annotations

import torch
from torch import nn

from runtime.native.attention_metadata import AttentionMetadata
from runtime.model_spec import ModelSpec
from runtime.native.models.activation import get_activation
from runtime.native.models.attention import Attention
from runtime.native.models.base import CausalLM
from runtime.native.models.embedding import Embedding
from runtime.native.models.linear import Linear
from runtime.native.models.norm import LayerNorm

# HF stores these as Conv1D, whose weight is [in, out]: the transpose of a Linear's
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


class GPT2Attention(nn.Module):
    """c_attn (q, k and v in one checkpoint tensor, one LoRA target as in PEFT), attention, c_proj."""

    def __init__(self, spec: ModelSpec, layer_idx: int, dtype: torch.dtype) -> None:
        super().__init__()
        hidden = spec.hidden_size
        self.c_attn = Linear(hidden, [("c_attn", 3 * hidden)], bias=True, dtype=dtype)
        self.c_proj = Linear(hidden, [("c_proj", hidden)], bias=True, dtype=dtype)
        scale = spec.head_dim**-0.5 if spec.config.get("scale_attn_weights", True) else 1.0
        if spec.config.get("scale_attn_by_inverse_layer_idx", False):
            scale /= layer_idx + 1
        self.attn = Attention(spec.num_heads, spec.num_heads, spec.head_dim, scale=scale)

    def forward(self, x: torch.Tensor, kv_cache: torch.Tensor | None, meta: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.c_attn(x).chunk(3, dim=-1)
        return self.c_proj(self.attn(q, k, v, kv_cache, meta))


class GPT2MLP(nn.Module):
    """c_proj(act(c_fc(x)))."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype) -> None:
        super().__init__()
        inner = int(spec.config.get("n_inner") or 4 * spec.hidden_size)
        self.c_fc = Linear(spec.hidden_size, [("c_fc", inner)], bias=True, dtype=dtype)
        self.c_proj = Linear(inner, [("c_proj", spec.hidden_size)], bias=True, dtype=dtype)
        self.act = get_activation(str(spec.config.get("activation_function", "gelu_new")))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class GPT2Block(nn.Module):
    """Pre-LayerNorm residual block."""

    def __init__(self, spec: ModelSpec, layer_idx: int, dtype: torch.dtype) -> None:
        super().__init__()
        eps = float(spec.config.get("layer_norm_epsilon", 1e-5))
        self.ln_1 = LayerNorm(spec.hidden_size, eps, dtype=dtype)
        self.attn = GPT2Attention(spec, layer_idx, dtype)
        self.ln_2 = LayerNorm(spec.hidden_size, eps, dtype=dtype)
        self.mlp = GPT2MLP(spec, dtype)

    def forward(self, x: torch.Tensor, kv_cache: torch.Tensor | None, meta: AttentionMetadata) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), kv_cache, meta)
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    """Token + learned position embeddings, blocks, final LayerNorm (checkpoint prefix "transformer.")."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype) -> None:
        super().__init__()
        self.wte = Embedding(spec.vocab_size, spec.hidden_size, dtype=dtype)
        self.wpe = Embedding(spec.max_position_embeddings, spec.hidden_size, dtype=dtype)
        self.h = nn.ModuleList(GPT2Block(spec, i, dtype) for i in range(spec.num_layers))
        self.ln_f = LayerNorm(spec.hidden_size, float(spec.config.get("layer_norm_epsilon", 1e-5)), dtype=dtype)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor], meta: AttentionMetadata
    ) -> torch.Tensor:
        x = self.wte(input_ids) + self.wpe(positions)
        for i, block in enumerate(self.h):
            x = block(x, kv_caches[i] if kv_caches else None, meta)
        return self.ln_f(x)


class GPT2LMHeadModel(CausalLM):
    """GPT-2 causal LM; the output projection is always the token embedding."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(spec)
        self.transformer = GPT2Model(spec, dtype)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor], meta: AttentionMetadata
    ) -> torch.Tensor:
        return self.transformer(input_ids, positions, kv_caches, meta)

    def output_embedding(self) -> torch.Tensor:
        return self.transformer.wte.weight

    def checkpoint_target(self, name: str) -> tuple[str, str | None] | None:
        if name.startswith("lm_head.") or name.endswith((".attn.bias", ".attn.masked_bias")):
            return None  # tied head; causal-mask buffers of old checkpoints
        if not name.startswith("transformer."):
            name = "transformer." + name  # the original "gpt2" checkpoints have no prefix
        return name, None

    def convert_tensor(self, param_name: str, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.t() if param_name.endswith(_CONV1D) else tensor
