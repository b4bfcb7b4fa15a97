"""Which architectures we implement, and the error for the others."""

from __future__ import annotations

from runtime.models.activation import get_activation
from runtime.models.base import CausalLM
from runtime.models.fp8_checkpoint import QUANT_METHODS, check_quantization_config
from runtime.models.gpt2 import GPT2LMHeadModel
from runtime.models.gpt_oss import GptOssForCausalLM
from runtime.models.llama import LlamaForCausalLM
from runtime.models.rotary_embedding import LAYER_TYPES, RopeConfig
from runtime.models.spec import ModelSpec

# every Llama-family architecture runs llama.py's decoder; what sets each apart is in its ModelSpec (spec.py)
_MODELS: dict[str, type[CausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
    "Gemma3ForCausalLM": LlamaForCausalLM,
    "Gemma3ForConditionalGeneration": LlamaForCausalLM,  # its text model
    "Phi3ForCausalLM": LlamaForCausalLM,
    "MixtralForCausalLM": LlamaForCausalLM,
    "Qwen3MoeForCausalLM": LlamaForCausalLM,
    "GptOssForCausalLM": GptOssForCausalLM,
    "GPT2LMHeadModel": GPT2LMHeadModel,
}

SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(_MODELS)


class UnsupportedArchitectureError(ValueError):
    """The checkpoint's architecture (or one of its options) is not implemented here."""

    def __init__(self, architecture: str, detail: str | None = None) -> None:
        reason = f" ({detail})" if detail else ""
        super().__init__(
            f"Unsupported model architecture {architecture!r}{reason}. "
            f"Supported architectures: {', '.join(SUPPORTED_ARCHITECTURES)}."
        )
        self.architecture = architecture


def model_class(architecture: str) -> type[CausalLM]:
    """The CausalLM subclass for an HF "architectures" name."""
    try:
        return _MODELS[architecture]
    except KeyError:
        raise UnsupportedArchitectureError(architecture) from None


def check_supported(spec: ModelSpec) -> None:
    """UnsupportedArchitectureError, before any weight is read, for an architecture or an option of its config
    that we do not implement."""
    model_class(spec.architecture)
    config = spec.config
    refused = {
        "quantization_config": "quantized checkpoints",
        "attn_logit_softcapping": "attention logit softcapping",
        "use_bidirectional_attention": "bidirectional attention",
    }
    if spec.architecture == "GptOssForCausalLM" and (config.get("quantization_config") or {}).get(
            "quant_method") == "mxfp4":
        refused.pop("quantization_config")  # OpenAI's own files: dequantized on load (gpt_oss.py)
    quantization = config.get("quantization_config") or {}
    if quantization.get("quant_method") in QUANT_METHODS:  # FP8 checkpoints (fp8_checkpoint.py)
        refused.pop("quantization_config")
        try:
            check_quantization_config(quantization)
        except ValueError as exc:
            raise UnsupportedArchitectureError(spec.architecture, str(exc)) from exc
    for key, what in refused.items():
        if config.get(key):
            raise UnsupportedArchitectureError(spec.architecture, f"not supported: {what} ({key})")
    try:
        for layer_type in LAYER_TYPES:
            RopeConfig.from_config(config, layer_type).check()
        get_activation(spec.hidden_act)
    except ValueError as exc:
        raise UnsupportedArchitectureError(spec.architecture, str(exc)) from exc
