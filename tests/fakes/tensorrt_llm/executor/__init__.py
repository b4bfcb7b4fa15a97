"""tensorrt_llm.executor: results and requests (real exports, subset)."""

from tensorrt_llm.executor.request import LoRARequest
from tensorrt_llm.executor.result import CompletionOutput, GenerationResult, IterationResult, Logprob

__all__ = ["CompletionOutput", "GenerationResult", "IterationResult", "Logprob", "LoRARequest"]
