"""Stand-ins for the C++ executor types (tensorrt_llm.bindings.executor) that the Python result handler reads.

Field names as NVIDIA/TensorRT-LLM tensorrt_llm/executor/result.py @ a678b91aafbeff265cd0b764abb59d7def624ac2
uses them (GenerationResultBase._handle_response / _handle_sequence): one Response per sequence of a request
(`sequence_index`); `is_final` only when every sequence of the request has finished (the C++ Result's
isFinal, where isSequenceFinal is per sequence); `output_token_ids[0]` holds the tokens this response adds
when streaming, all of the sequence's tokens otherwise; `log_probs[0]` grows monotonically (PyTorch sampler).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, List, Optional


class FinishReason(Enum):
    NOT_FINISHED = 0
    END_ID = 1
    STOP_WORDS = 2
    LENGTH = 3
    TIMED_OUT = 4
    CANCELLED = 5


@dataclass
class Result:
    """The part of tensorrt_llm::executor::Result the result handler reads."""

    is_final: bool
    sequence_index: int
    output_token_ids: List[List[int]]
    finish_reasons: List[FinishReason]
    cum_log_probs: Optional[List[float]] = None
    log_probs: Optional[List[list]] = None
    context_logits: Any = None
    generation_logits: Any = None
    decoding_iter: int = 0
    cached_tokens: int = 0


@dataclass
class Response:
    """tensorrt_llm::executor::Response: a result for the request `client_id`, or an error message."""

    client_id: int
    result: Optional[Result] = None
    error_msg: str = ""

    def has_error(self) -> bool:
        return self.result is None
