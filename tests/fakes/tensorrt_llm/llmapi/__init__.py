"""tensorrt_llm.llmapi: the LLM class and its config types (real exports, subset: NVIDIA/TensorRT-LLM
tensorrt_llm/llmapi/__init__.py @ 5ca85aff65b2c7d0ba06fb6c7d7c015ed78886f8)."""

from tensorrt_llm.executor import CompletionOutput, LoRARequest, RequestError
from tensorrt_llm.llmapi.llm import LLM, RequestOutput
from tensorrt_llm.llmapi.llm_args import (CapacitySchedulerPolicy, ContextChunkingPolicy,
                                          CudaGraphConfig, DraftTargetDecodingConfig,
                                          DynamicBatchConfig, EagleDecodingConfig, KvCacheConfig,
                                          LookaheadDecodingConfig, MedusaDecodingConfig,
                                          MTPDecodingConfig, NGramDecodingConfig, SchedulerConfig)
from tensorrt_llm.sampling_params import GuidedDecodingParams, SamplingParams

__all__ = ["LLM", "RequestOutput", "CompletionOutput", "LoRARequest", "RequestError", "SamplingParams",
           "GuidedDecodingParams", "KvCacheConfig", "SchedulerConfig", "CapacitySchedulerPolicy",
           "ContextChunkingPolicy", "DynamicBatchConfig", "CudaGraphConfig",
           "DraftTargetDecodingConfig", "NGramDecodingConfig", "EagleDecodingConfig",
           "MedusaDecodingConfig", "LookaheadDecodingConfig", "MTPDecodingConfig"]
