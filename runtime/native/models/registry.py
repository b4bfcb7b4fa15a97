"""The model class of each architecture we implement (runtime/architectures.py names them, without torch)."""

from __future__ import annotations

from runtime.architectures import SUPPORTED_ARCHITECTURES, UnsupportedArchitectureError
from runtime.native.models.base import CausalLM
from runtime.native.models.gpt2 import GPT2LMHeadModel
from runtime.native.models.gpt_oss import GptOssForCausalLM
from runtime.native.models.llama import LlamaForCausalLM

# the architectures with a class of their own; every other one runs llama.py's decoder
_OWN_CLASS: dict[str, type[CausalLM]] = {"GptOssForCausalLM": GptOssForCausalLM, "GPT2LMHeadModel": GPT2LMHeadModel}
_MODELS: dict[str, type[CausalLM]] = {name: _OWN_CLASS.get(name, LlamaForCausalLM) for name in SUPPORTED_ARCHITECTURES}


def model_class(architecture: str) -> type[CausalLM]:
    """The CausalLM subclass for an HF "architectures" name."""
    try:
        return _MODELS[architecture]
    except KeyError:
        raise UnsupportedArchitectureError(architecture) from None
