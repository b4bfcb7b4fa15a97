"""Which architectures the native runtime implements, and the one-line refusal of the others, told from a
checkpoint's config alone (no torch: the front end refuses them at start-up, before any weight is read).

The model classes behind the names are runtime/native/models/registry.py's; the activations' functions
runtime/native/models/activation.py's.
"""

from __future__ import annotations

from runtime.fp8_config import QUANT_METHODS, check_quantization_config
from runtime.int4_config import INT4_METHODS, check_int4_config
from runtime.model_spec import LAYER_TYPES, ModelSpec, RopeConfig

# every Llama-family architecture runs one decoder (runtime/native/models/llama.py); what sets each apart is in its ModelSpec
SUPPORTED_ARCHITECTURES: tuple[str, ...] = (
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM",
    "Gemma3ForConditionalGeneration",  # its text model
    "Phi3ForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM", "GptOssForCausalLM", "GPT2LMHeadModel",
)

# a config's `hidden_act` / `activation_function` -> the function it names (GPT-2's "gelu_new" and its kin are the
# tanh approximation of GELU)
ACTIVATIONS: dict[str, str] = {"silu": "silu", "swish": "silu", "relu": "relu", "gelu": "gelu",
                               "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh"}


class UnsupportedArchitectureError(ValueError):
    """The checkpoint's architecture (or one of its options) is not implemented here."""

    def __init__(self, architecture: str, detail: str | None = None) -> None:
        reason = f" ({detail})" if detail else ""
        super().__init__(
            f"Unsupported model architecture {architecture!r}{reason}. "
            f"Supported architectures: {', '.join(SUPPORTED_ARCHITECTURES)}."
        )
        self.architecture = architecture


def activation_kind(name: str) -> str:
    """The function a config's activation name stands for; ValueError for one we do not implement."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unsupported activation {name!r}; supported: {', '.join(ACTIVATIONS)}") from None


def check_supported(spec: ModelSpec) -> None:
    """UnsupportedArchitectureError, before any weight is read, for an architecture or an option of its config
    that we do not implement."""
    if spec.architecture not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedArchitectureError(spec.architecture)
    config = spec.config
    refused = {
        "quantization_config": "quantized checkpoints",
        "attn_logit_softcapping": "attention logit softcapping",
        "use_bidirectional_attention": "bidirectional attention",
    }
    quantization = config.get("quantization_config") or {}
    if spec.architecture == "GptOssForCausalLM" and quantization.get("quant_method") == "mxfp4":
        refused.pop("quantization_config")  # OpenAI's own files: dequantized on load (gpt_oss.py)
    # FP8 (runtime/native/models/fp8_checkpoint.py) and AWQ/GPTQ INT4 (int4_checkpoint.py) checkpoints
    check_quantization = {**dict.fromkeys(QUANT_METHODS, check_quantization_config),
                          **dict.fromkeys(INT4_METHODS, check_int4_config)}.get(quantization.get("quant_method"))
    if check_quantization is not None:
        refused.pop("quantization_config")
        try:
            check_quantization(quantization)
        except ValueError as exc:
            raise UnsupportedArchitectureError(spec.architecture, str(exc)) from exc
    for key, what in refused.items():
        if config.get(key):
            raise UnsupportedArchitectureError(spec.architecture, f"not supported: {what} ({key})")
    try:
        for layer_type in LAYER_TYPES:
            RopeConfig.from_config(config, layer_type).check()
        activation_kind(spec.hidden_act)
    except ValueError as exc:
        raise UnsupportedArchitectureError(spec.architecture, str(exc)) from exc
