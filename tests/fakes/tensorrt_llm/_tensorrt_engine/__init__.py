"""tensorrt_llm._tensorrt_engine.LLM: the LLM over a TensorRT engine folder built by trtllm-build."""

from tensorrt_llm.llmapi.llm import _TrtLLM as LLM

__all__ = ["LLM"]
