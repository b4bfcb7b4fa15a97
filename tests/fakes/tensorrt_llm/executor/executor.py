"""GenerationExecutor: the LLM's executor (real: NVIDIA/TensorRT-LLM tensorrt_llm/executor/executor.py
@ ed53795b33fc139493f762a1c6c53f691cf52d38, and the worker side of tensorrt_llm/executor/base_worker.py
@ 7b437aaa73bf5a44b1102aee5c631074da763b8f).

Behaviour kept from the real files:
- generate_async first calls _maybe_initialize_iteration_results: the iteration-stats IterationResult is made
  on the first request and marked undone on every later one; before the first request get_stats /
  aget_stats print "Iteration statistics are not available yet..." on every call and return nothing;
  after it, aget_stats returns that one shared IterationResult with the caller's timeout.
- The worker turns the request into the runtime's (_enqueue_request: SamplingParams._get_bad_words(),
  _get_stop_words(), end_id -1 with ignore_eos); any error there is a RequestError, which the worker process
  sends back as an ErrorResponse: generate_async returns, the consumer's first read raises it.
- Responses go through _maybe_wrap_response: with prompt_logprobs the worker computes the prompt rows from
  the context logits once (compute_logprobs without tokens, cached for streaming), attaches them to every
  response of the request, and drops the context logits unless the request asked for them.
The PyTorch-backend LLM steps a TorchEngine (worker.py); the TensorRT-engine LLM has none: its requests are
accepted and wait (a TensorRT engine cannot run here) until aborted or shut down.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any, Dict, List, Optional

from tensorrt_llm.bindings.executor import FinishReason, Response, Result
from tensorrt_llm.executor.request import LoRARequest
from tensorrt_llm.executor.result import (GenerationResult, IterationResult, LogProbsResult, ResponseWrapper,
                                          compute_logprobs)
from tensorrt_llm.executor.utils import ErrorResponse, RequestError
from tensorrt_llm.executor.worker import EngineRequest, TorchEngine
from tensorrt_llm.llmapi.utils import print_colored


async def empty_async_iterable():
    if False:  # ensures the function remains an async generator
        yield


class GenerationExecutor:
    """Results by request id, the shared iteration-stats result, and the loop that steps the engine."""

    def __init__(self, engine: Optional[TorchEngine], tokenizer: Any) -> None:
        self._engine = engine
        self._tokenizer = tokenizer
        self._results: Dict[int, GenerationResult] = {}
        self._ids = itertools.count(1)
        self._iter_stats_result: Optional[IterationResult] = None
        self._loop_task: Optional[asyncio.Task] = None
        self._wake: Optional[asyncio.Event] = None
        self.doing_shutdown = False

    def is_shutdown(self) -> bool:
        return self.doing_shutdown

    def generate_async(self, prompt_token_ids: List[int], sampling_params: Any,
                       lora_request: Optional[LoRARequest] = None, streaming: bool = False) -> GenerationResult:
        self._maybe_initialize_iteration_results()
        client_id = next(self._ids)
        result = GenerationResult(client_id, prompt_token_ids, sampling_params, streaming, self, self._tokenizer)
        self._results[client_id] = result
        try:
            self._enqueue_request(client_id, prompt_token_ids, sampling_params, streaming)
        except RequestError as e:  # the worker process answers with an error response
            self._results.pop(client_id)
            result.aqueue.put_nowait(ErrorResponse(client_id, str(e), client_id))
        return result

    def _enqueue_request(self, client_id: int, prompt: List[int], sp: Any, streaming: bool) -> None:
        try:
            request = EngineRequest(client_id=client_id, prompt=list(prompt), sp=sp, streaming=streaming,
                                    end_id=-1 if sp.ignore_eos or sp.end_id is None else sp.end_id,
                                    bad_words=sp._get_bad_words(), stop_words=sp._get_stop_words())
        except Exception as e:
            raise RequestError(str(e)) from e
        if self._engine is None:
            return  # a TensorRT engine cannot run here: the request waits
        self._engine.enqueue(request)
        self._ensure_loop()
        self._wake.set()

    def abort_request(self, client_id: int) -> None:
        if self._engine is not None:
            self._engine.abort(client_id)
            if self._wake is not None:
                self._wake.set()
        elif client_id in self._results:  # nothing runs it: every sequence answers cancelled at once
            result = self._results.pop(client_id)
            last = result.sampling_params.best_of - 1
            for i in range(last + 1):
                result.aqueue.put_nowait(Response(client_id, Result(
                    is_final=i == last, sequence_index=i, output_token_ids=[[]],
                    finish_reasons=[FinishReason.CANCELLED])))

    def _maybe_initialize_iteration_results(self) -> None:
        if self._iter_stats_result is None:
            self._iter_stats_result = IterationResult()  # singleton to store runtime stats
        else:
            self._iter_stats_result.mark_undone()  # expect more stats whenever new prompts are submitted

    def get_stats(self, timeout: Optional[float]) -> List[dict]:
        if self._iter_stats_result is None:
            print_colored("Iteration statistics are not available yet. To collect runtime statistics, please "
                          "call get_stats() AFTER prompts have been submitted.\n", "yellow")
            return []
        self._iter_stats_result.set_timeout(timeout)
        return self._iter_stats_result.get_results()

    def aget_stats(self, timeout: Optional[float]) -> Any:
        if self._iter_stats_result is None:
            print_colored("Iteration statistics are not available yet. To collect runtime statistics, please "
                          "call get_stats_async() in async coroutine or the /metrics endpoint (if you're using "
                          "trtllm-serve) AFTER prompts have been submitted.\n", "yellow")
            return empty_async_iterable()
        self._iter_stats_result.set_timeout(timeout)
        return self._iter_stats_result

    def shutdown(self) -> None:
        self.doing_shutdown = True
        if self._loop_task is not None:
            # The real shutdown blocks (it joins its workers), so callers run it in a thread: cancel
            # thread-safely, or the event loop would not wake up to process the cancellation.
            self._loop_task.get_loop().call_soon_threadsafe(self._loop_task.cancel)

    # -- the loop --------------------------------------------------------------------------------------

    def _ensure_loop(self) -> None:
        if self._loop_task is None:
            self._wake = asyncio.Event()
            self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while not self.doing_shutdown:
            if not self._engine.has_work:
                self._wake.clear()
                await self._wake.wait()
                continue
            # Off the event loop, as the real runtime works in its own threads/processes: the
            # server keeps serving (disconnects, health, metrics) while the model computes.
            responses, stats = await asyncio.to_thread(self._engine.step)
            for response in responses:
                self._deliver(response)
            if stats is not None:
                self._iter_stats_result.aqueue.put(json.dumps(stats))
            await asyncio.sleep(0)

    def _deliver(self, response: Response) -> None:
        """The worker's _maybe_wrap_response, then the response into its result's queue."""
        result = self._results.get(response.client_id)
        if result is None:
            return
        sp, rt = result.sampling_params, response.result
        logprobs = None
        if sp.prompt_logprobs:
            rows = getattr(result, "_cached_prompt_logprobs", None)
            if rows is None:
                rows = compute_logprobs(sp.prompt_logprobs, None, rt.context_logits, None, None).prompt
                result._cached_prompt_logprobs = rows
            logprobs = LogProbsResult(prompt=rows, generation=None)
            if not sp._need_return_context_logits:
                rt.context_logits = None
        result.aqueue.put_nowait(ResponseWrapper(response, logprobs) if logprobs else response)
        if rt.is_final:
            self._results.pop(response.client_id, None)
