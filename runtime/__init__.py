"""In-process LLM runtime: the Engine interface, its request/response types, and the two backends."""

from runtime.config import EngineConfig
from runtime.demo import demo_model_path
from runtime.engine import Engine, EngineStats, ModelInfo
from runtime.errors import (
    EngineError,
    EngineFailedError,
    EngineNotReadyError,
    InvalidRequestError,
    PromptTooLongError,
    QueueFullError,
    UnknownAdapterError,
    UnsupportedOptionError,
)
from runtime.request import (
    FinishReason,
    GenerationRequest,
    OutputDelta,
    SamplingOptions,
    Usage,
)


def build_engine(config: EngineConfig) -> Engine:
    """The engine for `config.backend`: "native" (our PyTorch runtime) or "trtllm" (TensorRT-LLM)."""
    if config.backend == "native":
        if config.data_parallel_size > 1:
            from runtime.process.data_parallel import DataParallelEngine

            return DataParallelEngine(config)
        if config.engine_process:
            from runtime.process.client import EngineClient

            return EngineClient(config)
        from runtime.native.llm_engine import NativeEngine

        return NativeEngine(config)
    if config.backend == "trtllm":
        from runtime.trtllm.engine import TrtllmEngine

        return TrtllmEngine(config)
    raise ValueError(f"unknown backend {config.backend!r}: choose 'native' or 'trtllm'")


__all__ = [
    "Engine", "EngineConfig", "EngineError", "EngineFailedError", "EngineNotReadyError", "EngineStats",
    "FinishReason", "GenerationRequest", "InvalidRequestError", "ModelInfo", "OutputDelta",
    "PromptTooLongError", "QueueFullError", "SamplingOptions", "UnknownAdapterError",
    "UnsupportedOptionError", "Usage", "build_engine", "demo_model_path",
]
