"""The TensorRT-LLM backend: runtime.engine.Engine over `tensorrt_llm.LLM` (tensorrt-llm 1.2.x).

Files: api.py (the one place `tensorrt_llm` is imported, lazily), model_folder.py (checkpoint or engine
folder), llm_config.py (EngineConfig -> LLM(...) arguments), sampling.py (GenerationRequest ->
SamplingParams, and the options this backend rejects), lora.py (adapter names -> LoRARequest),
output.py (CompletionOutput updates -> OutputDelta), stats.py (iteration stats -> EngineStats),
engine.py (TrtllmEngine). Importing this package does not import tensorrt_llm.

API facts come from NVIDIA/TensorRT-LLM sources; tests/fakes/trtllm_api_snapshot.json names each file
and commit they were read from (llm.py @ 4c05a74891e4df8066f08ed4ce14b0972abe4e25, sampling_params.py
@ a98a9061d72f6fd39f5d055ebdd2c6878a100e2c, executor/result.py @ a678b91aafbeff265cd0b764abb59d7def624ac2,
executor/request.py @ 4ce835a571f85cc37dcffb7268b3a4c014039ce6, lora_helper.py
@ 585c756579dc4d01f21fc13c2f604cdb461ac4f0, llmapi/__init__.py @ 5ca85aff65b2c7d0ba06fb6c7d7c015ed78886f8).
"""
