"""CompletionOutput, GenerationResult, IterationResult, compute_logprobs (real: NVIDIA/TensorRT-LLM
tensorrt_llm/executor/result.py @ a678b91aafbeff265cd0b764abb59d7def624ac2).

Behaviour kept from the real file:
- GenerationResult is awaitable (the final result) and async-iterable (one step per response). Each
  response belongs to ONE sequence (`sequence_index`): only `outputs[sequence_index]` moves its
  `_last_token_ids_len` / `_last_logprobs_len` markers and extends its tokens, so with n > 1 the other
  outputs keep their previous `token_ids_diff` / `logprobs_diff`.
- Finish reasons are set only when the whole request is done (`_done`, the response's is_final), and only
  for the sequence that response belongs to; there a STOP_WORDS finish names the stop word and cuts it from
  token_ids unless include_stop_str_in_output. A sequence that finished on an earlier response keeps no
  finish reason and keeps its stop word. CANCELLED marks the output 'cancelled' at once.
- An error response raises RequestError in the consumer (the background error handler).
- `outputs` picks the n best of best_of by cumulative logprob when n < best_of.
- IterationResult: one shared instance per executor; a timeout without a stat marks it done, and it stays
  done (ends every later iteration at once) until the next request is submitted (mark_undone).
- compute_logprobs: top-k rows of log_softmax(logits); with `tokens` the sampled token is added to its row.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, NamedTuple, Optional, Union

import torch

from tensorrt_llm.bindings.executor import FinishReason, Response
from tensorrt_llm.executor.utils import ErrorResponse, RequestError
from tensorrt_llm.llmapi.utils import AsyncQueue


@dataclass(slots=True)
class Logprob:
    """Holds logprob and vocab rank for a token."""

    logprob: float
    rank: Optional[int] = None


TokenLogprobs = List[Dict[int, Logprob]]


class LogProbsResult(NamedTuple):
    """Optional log probability outputs computed post runtime."""

    prompt: Optional[TokenLogprobs] = None
    generation: Optional[TokenLogprobs] = None


class ResponseWrapper:
    """A runtime response with the logprobs the worker computed after the runtime."""

    def __init__(self, response: Response, logprobs: Optional[LogProbsResult] = None) -> None:
        self._response = response
        self.logprobs = logprobs


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


class GenerationResult:
    """The handle generate_async returns; the executor puts the worker's responses into `aqueue`."""

    def __init__(self, request_id: int, prompt_token_ids: List[int], sampling_params: Any, streaming: bool,
                 executor: Any, tokenizer: Any = None) -> None:
        self.id = request_id
        self.sampling_params = sampling_params
        self._prompt_token_ids = list(prompt_token_ids)
        self._streaming = streaming
        self._executor = executor
        self.tokenizer = tokenizer
        self._outputs = [CompletionOutput(i) for i in range(sampling_params.best_of)]
        self._context_logits: Any = None
        self._done = False
        self._aborted = False
        self.decoding_iter = 0
        self.cached_tokens = 0
        self.aqueue: asyncio.Queue = asyncio.Queue()

    @property
    def request_id(self) -> int:
        return self.id

    @property
    def prompt_token_ids(self) -> List[int]:
        return self._prompt_token_ids

    @property
    def outputs(self) -> List[CompletionOutput]:
        sp = self.sampling_params
        if sp.use_beam_search or sp.n == sp.best_of:
            return self._outputs[: sp.n]
        ranked = sorted(self._outputs, key=lambda x: x.cumulative_logprob if x.cumulative_logprob is not None
                        else float("-inf"), reverse=True)
        for i, out in enumerate(ranked):
            out.index = i
        return ranked[: sp.n]

    @property
    def context_logits(self) -> Any:
        return self._context_logits

    @property
    def finished(self) -> bool:
        return self._done

    def abort(self) -> None:
        """Abort the generation request."""
        self._executor.abort_request(self.request_id)
        self._aborted = True

    def aborted(self) -> bool:
        return self._aborted

    def _handle_sequence(self, finish_reasons: List[FinishReason], result: Any, sequence_index: int,
                         logprobs_result: Optional[LogProbsResult]) -> None:
        sp = self.sampling_params
        src = sequence_index if sp.use_beam_search else 0
        output = self._outputs[sequence_index]
        output._last_token_ids_len = len(output.token_ids)
        if sp.use_beam_search:
            output.token_ids = result.output_token_ids[src]
        else:
            output.token_ids.extend(result.output_token_ids[src])
        if result.cum_log_probs is not None:
            output.cumulative_logprob = result.cum_log_probs[src]
        if logprobs_result and logprobs_result.prompt is not None:
            output.prompt_logprobs = logprobs_result.prompt
        if result.log_probs is not None:  # PyTorch backend: the sampler's list grows with every response
            output._last_logprobs_len = len(output.logprobs)
            output.logprobs += result.log_probs[src][output._last_logprobs_len:]
            if finish_reasons[src] != FinishReason.CANCELLED and len(output.logprobs) > output.length:
                output.logprobs = output.logprobs[: output.length]
        if result.generation_logits is not None:
            output.generation_logits = result.generation_logits[src, : output.length]
        if finish_reasons and finish_reasons[src] == FinishReason.CANCELLED:
            output.finish_reason = "cancelled"
        if self._done:
            reason = finish_reasons[src]
            if reason == FinishReason.END_ID:
                output.finish_reason = "stop"
            elif reason == FinishReason.STOP_WORDS:
                output.finish_reason = "stop"
                for stop_reason, stop_ids in sp._get_stop_reasons_and_words():
                    if output.token_ids[-len(stop_ids):] == stop_ids:
                        output.stop_reason = stop_reason
                        if not sp.include_stop_str_in_output:
                            output.token_ids = output.token_ids[: -len(stop_ids)]
                        break
            elif reason == FinishReason.LENGTH:
                output.finish_reason = "length"
            elif reason == FinishReason.TIMED_OUT:
                output.finish_reason = "timeout"
            elif reason != FinishReason.CANCELLED:
                raise ValueError(f"Unknown finish reason: {reason}")

    def _handle_response(self, response: Union[Response, ResponseWrapper, ErrorResponse]) -> None:
        logprobs_result = None
        if isinstance(response, ResponseWrapper):
            logprobs_result = response.logprobs
            response = response._response
        if isinstance(response, ErrorResponse) or response.has_error():
            raise RequestError(response.error_msg)  # GenerationExecutor._handle_background_error(str)
        result = response.result
        self._done = result.is_final
        self.decoding_iter = result.decoding_iter
        self.cached_tokens = result.cached_tokens
        if self.sampling_params.use_beam_search:
            for beam in range(len(result.output_token_ids)):
                self._handle_sequence(result.finish_reasons, result, beam, logprobs_result)
        else:
            self._handle_sequence(result.finish_reasons, result, result.sequence_index, logprobs_result)
        if result.context_logits is not None:
            self._context_logits = result.context_logits
        self._detokenize()

    def _detokenize(self) -> None:
        """DetokenizedGenerationResultBase (RequestOutput): the text of every output, when detokenize."""
        sp = self.sampling_params
        if not sp.detokenize or self.tokenizer is None:
            return
        for out in self.outputs:
            out._last_text_len = len(out.text)
            out.text = self.tokenizer.decode(out.token_ids, skip_special_tokens=sp.skip_special_tokens)

    async def _aresult_step(self) -> None:
        self._handle_response(await self.aqueue.get())

    async def aresult(self) -> "GenerationResult":
        while not self._done:
            await self._aresult_step()
        return self

    def __await__(self):
        return self.aresult().__await__()

    def __aiter__(self) -> "GenerationResult":
        return self

    async def __anext__(self) -> "GenerationResult":
        if self._done:
            raise StopAsyncIteration
        await self._aresult_step()
        return self


class IterationResult:
    """Runtime results (iteration stats as JSON strings) for all available iterations."""

    def __init__(self) -> None:
        self._done = False
        self._timeout: Optional[float] = 2
        self.aqueue = AsyncQueue()

    def set_timeout(self, timeout: Optional[float]) -> None:
        self._timeout = timeout

    def mark_undone(self) -> None:
        # should be called when new prompts are submitted
        self._done = False

    def get_results(self) -> List[dict]:
        """Every result queued now (the real sync queue waits `timeout` for the next; the fake's
        producers run on the caller's event loop, so there is nothing to wait for)."""
        results = []
        while not self._done:
            try:
                results.append(json.loads(self.aqueue.get_nowait()))
            except asyncio.QueueEmpty:
                self._done = True
        return results

    def __aiter__(self) -> "IterationResult":
        return self

    async def __anext__(self) -> dict:
        if self._done:
            raise StopAsyncIteration
        try:
            data = await self.aqueue.get(timeout=self._timeout)
            return json.loads(data)
        except asyncio.TimeoutError:
            self._done = True
            raise StopAsyncIteration


def compute_logprobs(k_prompt_logprobs: Optional[int], k_logprobs: Optional[int], context_logits: Any,
                     generation_logits: Any, output_token_ids: Optional[List[int]]) -> LogProbsResult:
    """Top-k logprob rows from logits. Row t of the prompt rows is the distribution after prompt token t, so
    it describes token t + 1 (the last row: the first generated token); without `tokens` a row holds the top
    k only, whatever the token that followed."""

    def topk_rows(logits: torch.Tensor, top_k: int, tokens: Optional[List[int]]) -> TokenLogprobs:
        if logits.dim() == 3:
            logits = logits.squeeze(0)
        if tokens is not None and logits.size(0) > len(tokens):
            logits = logits[: len(tokens)]
        logprobs = torch.log_softmax(logits.to(dtype=torch.float32), dim=-1)
        values, indices = torch.topk(logprobs, k=top_k, dim=-1)
        rows: TokenLogprobs = []
        for t in range(logprobs.size(0)):
            row = {int(i): Logprob(logprob=float(v), rank=r + 1)
                   for r, (v, i) in enumerate(zip(values[t], indices[t]))}
            if tokens is not None and tokens[t] not in row:
                value = float(logprobs[t, tokens[t]])
                row[tokens[t]] = Logprob(logprob=value, rank=int((logprobs[t] > value).sum()) + 1)
            rows.append(row)
        return rows

    prompt = (topk_rows(context_logits, k_prompt_logprobs, None)
              if k_prompt_logprobs and context_logits is not None else None)
    generation = (topk_rows(generation_logits, k_logprobs, output_token_ids)
                  if k_logprobs and generation_logits is not None else None)
    return LogProbsResult(prompt=prompt, generation=generation)
