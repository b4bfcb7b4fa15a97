"""Which architectures we implement, and the error for the others."""

from __future__ import annotations

from runtime.models.base import CausalLM
from runtime.models.gpt2 import GPT2LMHeadModel
from runtime.models.llama import LlamaForCausalLM

_MODELS: dict[str, type[CausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,  # Llama layers; sliding window unused (see llama.py)
    "Qwen2ForCausalLM": LlamaForCausalLM,  # Llama layers with q/k/v bias
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
