"""The only place `tensorrt_llm` is imported, lazily: `load_api()` returns the names the backend uses.

Import paths as in tensorrt-llm 1.2 (NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/__init__.py @
5ca85aff65b2c7d0ba06fb6c7d7c015ed78886f8): the PyTorch-backend `LLM` and the config classes from
`tensorrt_llm.llmapi`, the TensorRT-engine `LLM` from `tensorrt_llm._tensorrt_engine`, `LoraConfig` from
`tensorrt_llm.lora_helper` (tensorrt_llm/lora_helper.py @ 585c756579dc4d01f21fc13c2f604cdb461ac4f0).
The speculative decoding configs are looked up by name: the 1.3 line no longer exports some of them
(Medusa, Lookahead) from `tensorrt_llm.llmapi`, so a missing one is taken from `tensorrt_llm.llmapi.llm_args`,
or left None (the backend then starts, and refuses only that kind of speculation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.errors import EngineFailedError

# The package is installed from its checkout (`pip install '.[trtllm]'` brings tensorrt-llm); naming the
# tensorrt-llm requirement too covers installs made some other way.
INSTALL_HINT = "`pip install '.[trtllm]'` in the trtllm-gateway checkout, or `pip install 'tensorrt-llm>=1.2,<1.3'`"


class TrtllmNotInstalledError(EngineFailedError):
    """tensorrt_llm cannot be imported; the message is one line naming the install command."""


@dataclass(frozen=True)
class TrtllmApi:
    """The tensorrt_llm names the backend uses (classes, looked up once)."""

    LLM: Any  # PyTorch backend: Hugging Face checkpoint folders
    TrtLLM: Any  # TensorRT backend: engine folders built by trtllm-build
    SamplingParams: Any
    GuidedDecodingParams: Any
    LoRARequest: Any
    LoraConfig: Any
    KvCacheConfig: Any
    SchedulerConfig: Any
    CapacitySchedulerPolicy: Any
    CudaGraphConfig: Any
    DraftTargetDecodingConfig: Any  # each speculative config: None when this release has none
    NGramDecodingConfig: Any
    EagleDecodingConfig: Any
    MedusaDecodingConfig: Any
    LookaheadDecodingConfig: Any
    MTPDecodingConfig: Any
    version: str


SPECULATIVE_CONFIGS = ("DraftTargetDecodingConfig", "NGramDecodingConfig", "EagleDecodingConfig",
                       "MedusaDecodingConfig", "LookaheadDecodingConfig", "MTPDecodingConfig")


def _speculative_config_class(llmapi: Any, name: str) -> Any:
    """`tensorrt_llm.llmapi.<name>`, else `tensorrt_llm.llmapi.llm_args.<name>` (1.3), else None."""
    found = getattr(llmapi, name, None)
    if found is None:
        try:
            from tensorrt_llm.llmapi import llm_args
        except ImportError:
            return None
        found = getattr(llm_args, name, None)
    return found


def load_api() -> TrtllmApi:
    """Import tensorrt_llm; raise TrtllmNotInstalledError (one clear line) when it is missing."""
    try:
        import tensorrt_llm
        from tensorrt_llm import llmapi
        from tensorrt_llm._tensorrt_engine import LLM as TrtLLM
        from tensorrt_llm.lora_helper import LoraConfig
    except ImportError as exc:
        raise TrtllmNotInstalledError(
            f"The trtllm backend needs TensorRT-LLM, which cannot be imported ({exc}); "
            f"install it with {INSTALL_HINT}"
        ) from None
    return TrtllmApi(
        LLM=llmapi.LLM, TrtLLM=TrtLLM, SamplingParams=llmapi.SamplingParams,
        GuidedDecodingParams=llmapi.GuidedDecodingParams, LoRARequest=llmapi.LoRARequest,
        LoraConfig=LoraConfig, KvCacheConfig=llmapi.KvCacheConfig,
        SchedulerConfig=llmapi.SchedulerConfig, CapacitySchedulerPolicy=llmapi.CapacitySchedulerPolicy,
        CudaGraphConfig=llmapi.CudaGraphConfig,
        **{name: _speculative_config_class(llmapi, name) for name in SPECULATIVE_CONFIGS},
        version=str(getattr(tensorrt_llm, "__version__", "unknown")),
    )
