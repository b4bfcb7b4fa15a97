"""tensorrt_llm.executor: results, requests and the executor (real exports, subset)."""

from tensorrt_llm.executor.executor import GenerationExecutor
from tensorrt_llm.executor.request import LoRARequest
from tensorrt_llm.executor.result import CompletionOutput, GenerationResult, IterationResult, Logprob
from tensorrt_llm.executor.utils import RequestError

__all__ = ["CompletionOutput", "GenerationExecutor", "GenerationResult", "IterationResult", "Logprob",
           "LoRARequest", "RequestError"]
