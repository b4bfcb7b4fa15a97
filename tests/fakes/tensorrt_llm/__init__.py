"""A fake `tensorrt_llm` for tests: the names the gateway's TensorRT-LLM backend uses, with the real
signatures and behaviour (see ../trtllm_api_snapshot.json, and each module's docstring, for the sources and
commits they follow).

It is importable as `tensorrt_llm` only when a test puts tests/fakes on sys.path. Its LLM runs a tiny
Hugging Face checkpoint with transformers (no TensorRT, no GPU), one token per sequence per iteration,
so end-to-end tests see real, deterministic tokens.
"""

from tensorrt_llm import version
from tensorrt_llm.llmapi import LLM, RequestOutput  # before executor: executor.result imports llmapi.utils
from tensorrt_llm.executor import CompletionOutput, LoRARequest
from tensorrt_llm.sampling_params import GuidedDecodingParams, SamplingParams

__version__ = version.__version__

__all__ = ["LLM", "RequestOutput", "SamplingParams", "GuidedDecodingParams", "CompletionOutput",
           "LoRARequest", "__version__"]
