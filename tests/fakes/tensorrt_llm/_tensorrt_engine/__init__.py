"""tensorrt_llm._tensorrt_engine.LLM: the LLM over a TensorRT engine folder built by trtllm-build (the class
_TrtLLM of tensorrt_llm/llmapi/llm.py @ 4c05a74891e4df8066f08ed4ce14b0972abe4e25, which points users at
`from tensorrt_llm._tensorrt_engine import LLM`)."""

from tensorrt_llm.llmapi.llm import _TrtLLM as LLM

__all__ = ["LLM"]
