"""The Triton TensorRT-LLM backend's dialect: generate-extension requests and responses, KServe v2
metadata, and the backend's config.pbtxt model repository (pure translation, no I/O but file reads
of the model repository)."""

from adapters.triton.generate import IDS_MODEL_NAME, TEXT_MODEL_NAMES, TritonGenerate, model_kind, parse_generate
from adapters.triton.model_repo import TritonRepoError, TritonRepoSettings, load_triton_repo
from adapters.triton.outputs import ResponseCollector, StreamRenderer, generate_responses

__all__ = [
    "IDS_MODEL_NAME",
    "TEXT_MODEL_NAMES",
    "ResponseCollector",
    "StreamRenderer",
    "TritonGenerate",
    "TritonRepoError",
    "TritonRepoSettings",
    "generate_responses",
    "load_triton_repo",
    "model_kind",
    "parse_generate",
]
