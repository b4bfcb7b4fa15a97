"""ModelSpec: the shape facts of a checkpoint, read from its config.json (and generation_config.json), and its RoPE
settings (RopeConfig). No torch: the front end reads the served model's description here too (runtime/served_model.py);
the native models build their layers from it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.config import DTYPE_NAMES

# Real-world checkpoints spell the same fact differently (GPT-2 style vs Llama style names).
_ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd"),
    "num_layers": ("num_hidden_layers", "n_layer"),
    "num_heads": ("num_attention_heads", "n_head"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "n_ctx"),
}

# model_type -> architecture, for configs saved without an "architectures" list (and GGUF files' converted ones)
DEFAULT_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "gpt2": "GPT2LMHeadModel",
}

# The facts of an architecture that its config does not state (the rest is read from the config).
_QWEN3 = {"qk_norm": True}
_GEMMA3 = {"qk_norm": True, "norm_offset": 1.0, "norm_weight_in_float32": True, "sandwich_norms": True,
           "embedding_scaled": True}
_ARCHITECTURE_FACTS: dict[str, dict[str, Any]] = {
    "Qwen2ForCausalLM": {"qkv_bias": True},
    "Qwen3ForCausalLM": _QWEN3,
    "Qwen3MoeForCausalLM": _QWEN3,
    "Gemma3ForCausalLM": _GEMMA3,
    "Gemma3ForConditionalGeneration": _GEMMA3,
    "GptOssForCausalLM": {"norm_weight_in_float32": True, "attention_sinks": True},
}

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
class MoeSpec:
    """A mixture-of-experts MLP: each token runs `top_k` of `num_experts` SwiGLU experts, weighted by its router.

    routing "softmax_topk": softmax over all experts, the top k, renormalised when `renormalize` (Mixtral, Qwen3-MoE);
    "topk_softmax": the top k logits, softmax over those (gpt-oss). activation "silu": silu(gate) * up; "swiglu_clamp":
    gpt-oss's gate and up clamped to `limit`, (up + 1) * gate * sigmoid(alpha * gate)."""

    num_experts: int
    top_k: int
    intermediate_size: int
    routing: str = "softmax_topk"
    renormalize: bool = True
    router_bias: bool = False
    expert_bias: bool = False
    activation: str = "silu"
    alpha: float = 1.702
    limit: float = 7.0
    sparse_layers: list[bool] = field(default_factory=list)  # per layer: experts (True) or the dense MLP

    @classmethod
    def from_config(cls, architecture: str, config: dict[str, Any], num_layers: int) -> MoeSpec | None:
        experts = int(config.get("num_local_experts") or config.get("num_experts") or 0)
        if not experts:
            return None
        top_k = int(config["num_experts_per_tok"])
        if architecture == "GptOssForCausalLM":
            return cls(experts, top_k, int(config["intermediate_size"]), routing="topk_softmax", router_bias=True,
                       expert_bias=True, activation="swiglu_clamp", alpha=float(config.get("swiglu_alpha", 1.702)),
                       limit=float(config.get("swiglu_limit", 7.0)), sparse_layers=[True] * num_layers)
        dense = set(config.get("mlp_only_layers") or [])
        step = int(config.get("decoder_sparse_step") or 1)
        return cls(experts, top_k, int(config.get("moe_intermediate_size") or config["intermediate_size"]),
                   renormalize=bool(config.get("norm_topk_prob", True)),
                   sparse_layers=[i not in dense and (i + 1) % step == 0 for i in range(num_layers)])


def _layer_windows(architecture: str, config: dict[str, Any], num_layers: int) -> list[int | None]:
    """Per layer, how many keys (itself included) a query attends to: the sliding window, or None for all of them.

    Configs that name layer types (Gemma 3, gpt-oss, transformers>=5's Qwen) say which layers slide; Qwen's older
    configs slide from `max_window_layers` on when `use_sliding_window`; Mistral, Mixtral and Phi-3 slide everywhere
    when `sliding_window` is set, as transformers applies it."""
    window = config.get("sliding_window")
    types = config.get("layer_types")
    if not types and architecture.startswith("Gemma3"):
        pattern = int(config.get("sliding_window_pattern", 6))
        types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(num_layers)]
    if not types and architecture.startswith("Qwen"):
        start = int(config.get("max_window_layers", num_layers))
        slide = bool(config.get("use_sliding_window")) and window
        types = ["sliding_attention" if slide and i >= start else "full_attention" for i in range(num_layers)]
    if not types:
        types = ["sliding_attention" if window else "full_attention"] * num_layers
    if len(types) < num_layers or not set(types) <= {"full_attention", "sliding_attention"}:
        raise ValueError(f"layer_types {types} are not {num_layers} of full_attention / sliding_attention")
    if "sliding_attention" in types and not window:
        raise ValueError("sliding layers without a sliding_window")
    return [int(window) if t == "sliding_attention" else None for t in types[:num_layers]]


@dataclass
class ModelSpec:
    """What the engine needs to know about a model: shapes, context window, special token ids, and what sets its
    layers apart from Llama's (one field per difference, read from the config or `_ARCHITECTURE_FACTS`)."""

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
    dtype: str = "float32"  # the checkpoint's dtype (config "torch_dtype"/"dtype"), one of bfloat16/float16/float32
    config: dict[str, Any] = field(default_factory=dict, repr=False)  # raw config.json, for model builders
    layer_windows: list[int | None] = field(default_factory=list)  # per layer: sliding window (None: full)
    qkv_bias: bool = False  # q/k/v projections have a bias (Qwen2, gpt-oss, "attention_bias")
    o_bias: bool = False  # the output projection has one ("attention_bias")
    qk_norm: bool = False  # RMSNorm of each query and key head before RoPE (Qwen3, Gemma 3)
    norm_offset: float = 0.0  # RMSNorm scales by (offset + weight): Gemma's 1
    norm_weight_in_float32: bool = False  # RMSNorm multiplies by its weight before casting back (Gemma, gpt-oss)
    sandwich_norms: bool = False  # norms after attention and the MLP too (Gemma 3)
    embedding_scaled: bool = False  # embeddings times sqrt(hidden_size) (Gemma)
    attention_scale: float = 0.0  # query scale (0: head_dim ** -0.5; Gemma: query_pre_attn_scalar ** -0.5)
    attention_sinks: bool = False  # a learned logit per head in every softmax (gpt-oss)
    final_logit_softcap: float | None = None  # logits = cap * tanh(logits / cap) (Gemma)
    hidden_act: str = "silu"
    moe: MoeSpec | None = None
    context_window: int = 0  # the served context (max_model_len; 0: max_position_embeddings), for LongRoPE

    def __post_init__(self) -> None:
        self.attention_scale = self.attention_scale or self.head_dim**-0.5
        self.context_window = self.context_window or self.max_position_embeddings
        self.layer_windows = self.layer_windows or [None] * self.num_layers

    @property
    def sliding_window(self) -> int | None:
        """The widest window when every layer slides (blocks older than it are never read again), else None."""
        windows = set(self.layer_windows)
        return None if None in windows else max(windows)  # type: ignore[type-var]

    @classmethod
    def from_config(cls, config: dict[str, Any], generation_config: dict[str, Any] | None = None) -> ModelSpec:
        """Build from config.json's dict; generation_config.json's eos ids are merged in (HF does the same)."""
        archs = config.get("architectures") or []
        architecture = archs[0] if archs else DEFAULT_ARCHITECTURES.get(config.get("model_type", ""), "")
        if not architecture:
            architecture = str(config.get("model_type") or "<unknown>")
        if architecture == "Gemma3ForConditionalGeneration":  # served as its text model (its images are not)
            config = {**config["text_config"], "architectures": [architecture],
                      "eos_token_id": config.get("eos_token_id", config["text_config"].get("eos_token_id"))}
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
        layers = int(_first(config, "num_layers"))
        facts = _ARCHITECTURE_FACTS.get(architecture, {})
        attention_bias = bool(config.get("attention_bias", False))
        pre_attn_scalar = config.get("query_pre_attn_scalar") if architecture.startswith("Gemma3") else None
        return cls(
            architecture=architecture,
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            max_position_embeddings=int(_first(config, "max_position_embeddings")),
            eos_token_ids=eos,
            bos_token_id=int(bos) if isinstance(bos, int) else None,
            dtype=str(dtype_name) if dtype_name in DTYPE_NAMES else "float32",
            config=config,
            layer_windows=_layer_windows(architecture, config, layers),
            qkv_bias=attention_bias or facts.get("qkv_bias", False),
            o_bias=attention_bias,
            qk_norm=facts.get("qk_norm", False),
            norm_offset=facts.get("norm_offset", 0.0),
            norm_weight_in_float32=facts.get("norm_weight_in_float32", False),
            sandwich_norms=facts.get("sandwich_norms", False),
            embedding_scaled=facts.get("embedding_scaled", False),
            attention_scale=float(pre_attn_scalar) ** -0.5 if pre_attn_scalar else 0.0,
            attention_sinks=facts.get("attention_sinks", False),
            # (transformers' multimodal Gemma 3 applies none, whatever its text config says)
            final_logit_softcap=None if architecture == "Gemma3ForConditionalGeneration"
            else config.get("final_logit_softcapping"),
            hidden_act=str(config.get("hidden_activation") or config.get("hidden_act") or "silu"),
            moe=MoeSpec.from_config(architecture, config, layers),
        )

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelSpec:
        """Read `path`/config.json (and generation_config.json when present)."""
        folder = Path(path)
        config = json.loads((folder / "config.json").read_text())
        gen_path = folder / "generation_config.json"
        generation = json.loads(gen_path.read_text()) if gen_path.exists() else None
        return cls.from_config(config, generation)


ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass
class RopeConfig:
    """RoPE settings, whichever way the config spells them."""

    theta: float
    rope_type: str
    params: dict[str, Any]
    partial_rotary_factor: float = 1.0

    @classmethod
    def from_config(cls, config: dict[str, Any], layer_type: str | None = None) -> RopeConfig:
        """The settings of `layer_type`'s layers (Gemma 3 gives its sliding layers their own base)."""
        # transformers>=5 writes "rope_parameters" (theta inside), per layer type where they differ; older
        # checkpoints write "rope_theta" plus an optional "rope_scaling" dict with "type" or "rope_type" (Gemma 3:
        # "rope_local_base_freq" for its sliding layers, whose rope_scaling is the global layers' only)
        params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
        if set(params) & set(LAYER_TYPES):
            params = dict(params.get(layer_type or "full_attention") or {})
        elif layer_type == "sliding_attention" and "rope_local_base_freq" in config:
            params = {"rope_type": "default", "rope_theta": config["rope_local_base_freq"]}
        theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
        rope_type = str(params.get("rope_type", params.get("type", "default")))
        rope_type = "longrope" if rope_type == "su" else rope_type  # Phi-3's first name for it
        if config.get("original_max_position_embeddings"):  # Phi-3 states it beside rope_scaling
            params.setdefault("original_max_position_embeddings", config["original_max_position_embeddings"])
        partial = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
        return cls(theta=theta, rope_type=rope_type, params=params, partial_rotary_factor=float(partial))

    def check(self) -> None:
        """ValueError for a type we do not implement."""
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope type {self.rope_type!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
