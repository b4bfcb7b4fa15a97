"""CompletionOutput, GenerationResult, IterationResult (real: NVIDIA/TensorRT-LLM
tensorrt_llm/executor/result.py @ a678b91aafbeff265cd0b764abb59d7def624ac2).

GenerationResult, as in the real one, is both awaitable (the final result) and async-iterable (one
update per runtime iteration when streaming, one at the end otherwise). Each update sets the
`_last_*_len` markers first, so `token_ids_diff` / `text_diff` / `logprobs_diff` are what it added.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional, Union


@dataclass(slots=True)
class Logprob:
    """Holds logprob and vocab rank for a token."""

    logprob: float
    rank: Optional[int] = None


TokenLogprobs = List[Dict[int, Logprob]]


@dataclass(slots=True)
class CompletionOutput:
    """One output sequence of a request (real field names and order)."""

    index: int
    text: str = ""
    token_ids: Optional[List[int]] = field(default_factory=list)
    cumulative_logprob: Optional[float] = None
    logprobs: Optional[Union[TokenLogprobs, List[float]]] = field(default_factory=list)
    prompt_logprobs: Optional[TokenLogprobs] = field(default_factory=list)
    finish_reason: Optional[Literal["stop", "length", "timeout", "cancelled"]] = None
    stop_reason: Optional[Union[int, str]] = None
    generation_logits: Optional[Any] = None
    additional_context_outputs: Optional[Dict[str, Any]] = None
    additional_generation_outputs: Optional[Dict[str, Any]] = None
    disaggregated_params: Optional[Any] = None
    request_perf_metrics: Optional[Any] = None

    _last_text_len: int = field(default=0, init=False, repr=False)
    _last_token_ids_len: int = field(default=0, init=False, repr=False)
    _last_logprobs_len: int = field(default=0, init=False, repr=False)
    _incremental_states: Optional[dict] = field(default=None, init=False, repr=False)
    _postprocess_result: Any = None

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def text_diff(self) -> str:
        return self.text[self._last_text_len:]

    @property
    def token_ids_diff(self) -> List[int]:
        return self.token_ids[self._last_token_ids_len:]

    @property
    def logprobs_diff(self) -> Union[TokenLogprobs, List[float]]:
        return self.logprobs[self._last_logprobs_len:]


Update = Callable[["GenerationResult"], None]  # applied by the result when the consumer reads it


class GenerationResult:
    """The handle generate_async returns. The fake's executor pushes `Update`s into its queue."""

    def __init__(self, request_id: int, prompt_token_ids: List[int], sampling_params: Any,
                 streaming: bool, abort_fn: Callable[[int], None]) -> None:
        self.id = request_id  # GenerationResultBase.id; request_id is a property, as in the real class
        self._prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self._streaming = streaming
        self._abort_fn = abort_fn
        self._outputs = [CompletionOutput(i) for i in range(sampling_params.best_of)]
        self._context_logits: Any = None
        self._done = False
        self._aborted = False
        self.cached_tokens = 0
        self.queue: asyncio.Queue[Update] = asyncio.Queue()

    @property
    def request_id(self) -> int:
        return self.id

    @property
    def prompt_token_ids(self) -> List[int]:
        return self._prompt_token_ids

    @property
    def outputs(self) -> List[CompletionOutput]:
        return self._outputs[: self.sampling_params.n]

    @property
    def context_logits(self) -> Any:
        return self._context_logits

    @property
    def finished(self) -> bool:
        return self._done

    def abort(self) -> None:
        """Abort the generation request (the final update then carries finish_reason 'cancelled')."""
        self._abort_fn(self.request_id)
        self._aborted = True

    def aborted(self) -> bool:
        return self._aborted

    async def _step(self) -> None:
        update = await self.queue.get()
        for out in self._outputs:
            out._last_token_ids_len = len(out.token_ids)
            out._last_text_len = len(out.text)
            out._last_logprobs_len = len(out.logprobs)
        update(self)

    async def aresult(self) -> "GenerationResult":
        while not self._done:
            await self._step()
        return self

    def __await__(self):
        return self.aresult().__await__()

    def __aiter__(self) -> "GenerationResult":
        return self

    async def __anext__(self) -> "GenerationResult":
        if self._done:
            raise StopAsyncIteration
        if self._streaming:
            await self._step()
        else:
            await self.aresult()
        return self


class IterationResult:
    """Async iterator over queued iteration-stats dicts; ends when none arrives within `timeout`."""

    def __init__(self, queue: "asyncio.Queue[dict]", timeout: Optional[float]) -> None:
        self._queue = queue
        self._timeout = timeout

    def __aiter__(self) -> "IterationResult":
        return self

    async def __anext__(self) -> dict:
        try:
            return await asyncio.wait_for(self._queue.get(), self._timeout)
        except asyncio.TimeoutError:
            raise StopAsyncIteration from None
