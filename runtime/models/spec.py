"""ModelSpec: the shape facts of a checkpoint, read from its config.json (and generation_config.json)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# Real-world checkpoints spell the same fact differently (GPT-2 style vs Llama style names).
_ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd"),
    "num_layers": ("num_hidden_layers", "n_layer"),
    "num_heads": ("num_attention_heads", "n_head"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "n_ctx"),
}

# model_type -> architecture, for configs saved without an "architectures" list.
_DEFAULT_ARCHITECTURE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
}

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _first(config: dict[str, Any], key: str) -> Any:
    for name in _ALIASES.get(key, (key,)):
        if config.get(name) is not None:
            return config[name]
    raise KeyError(f"config.json has no {key!r} (looked for {', '.join(_ALIASES.get(key, (key,)))})")


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, list) else [value])]


@dataclass
class ModelSpec:
    """What the engine needs to know about a model: shapes, context window, special token ids."""

    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    eos_token_ids: list[int]
    bos_token_id: int | None
    torch_dtype: torch.dtype = torch.float32  # the checkpoint's dtype (config "torch_dtype"/"dtype")
    config: dict[str, Any] = field(default_factory=dict, repr=False)  # raw config.json, for model builders

    @classmethod
    def from_config(cls, config: dict[str, Any], generation_config: dict[str, Any] | None = None) -> "ModelSpec":
        """Build from config.json's dict; generation_config.json's eos ids are merged in (HF does the same)."""
        archs = config.get("architectures") or []
        architecture = archs[0] if archs else _DEFAULT_ARCHITECTURE.get(config.get("model_type", ""), "")
        if not architecture:
            architecture = str(config.get("model_type") or "<unknown>")
        hidden = int(_first(config, "hidden_size"))
        heads = int(_first(config, "num_heads"))
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        eos = _as_id_list(config.get("eos_token_id"))
        for token_id in _as_id_list((generation_config or {}).get("eos_token_id")):
            if token_id not in eos:
                eos.append(token_id)
        bos = config.get("bos_token_id")
        dtype_name = config.get("torch_dtype") or config.get("dtype") or "float32"
        return cls(
            architecture=architecture,
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden,
            num_layers=int(_first(config, "num_layers")),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            max_position_embeddings=int(_first(config, "max_position_embeddings")),
            eos_token_ids=eos,
            bos_token_id=int(bos) if isinstance(bos, int) else None,
            torch_dtype=_DTYPES.get(str(dtype_name), torch.float32),
            config=config,
        )

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "ModelSpec":
        """Read `path`/config.json (and generation_config.json when present)."""
        folder = Path(path)
        config = json.loads((folder / "config.json").read_text())
        gen_path = folder / "generation_config.json"
        generation = json.loads(gen_path.read_text()) if gen_path.exists() else None
        return cls.from_config(config, generation)
