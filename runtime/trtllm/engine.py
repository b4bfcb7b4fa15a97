"""TrtllmEngine: runtime.engine.Engine over TensorRT-LLM's Python LLM API (tensorrt-llm 1.2.x).

Every request runs as `LLM.generate_async(prompt_token_ids, sampling_params=..., lora_request=...,
streaming=True)` (NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm.py @ 4c05a74891e4df8066f08ed4ce14b0972abe4e25);
the result is iterated once per runtime response and the tokens each CompletionOutput gained become
token-level OutputDeltas (runtime/trtllm/output.py), whose text the front end's OutputProcessor makes
(runtime/output_processor.py), as for the native engine.
Prompts are tokenised (and chat templates applied, by the adapters) with our runtime.tokenizer, so both
backends count the same prompt tokens. `result.abort()` cancels: on abort(), a closed iterator (client
gone), stop strings that ended every sample, a deadline, or shutdown. Iteration stats come from `LLM.get_stats_async`, read by a
background task from the first request on. Errors TensorRT-LLM raises while taking a request (ValueError from
SamplingParams, LoRARequest or its argument checks) are InvalidRequestError.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from runtime.config import EngineConfig
from runtime.default_model import resolve_model
from runtime.engine import Engine, EngineStats, ModelInfo
from runtime.errors import (
    EngineError,
    EngineFailedError,
    EngineNotReadyError,
    InvalidRequestError,
    QueueFullError,
)
from runtime.output_processor import OutputProcessor
from runtime.request import GenerationRequest, OutputDelta, Usage
from runtime.tokenizer import Tokenizer
from runtime.trtllm.api import load_api
from runtime.trtllm.llm_config import TRTLLM_MAX_NUM_TOKENS, llm_arguments
from runtime.trtllm.lora import TrtllmAdapters
from runtime.trtllm.model_folder import ModelFolder
from runtime.trtllm.output import SequenceStream, convert_prompt_logprobs
from runtime.trtllm.sampling import SamplingContext, build_sampling_params
from runtime.trtllm.stats import StatsCollector
from runtime.workers import WorkerPool, is_heavy

_STATS_POLL_S = 0.5


def _draft_len(spec: Any) -> int:
    """Draft tokens per step of the speculative config (0: no speculation)."""
    return int(getattr(spec, "max_draft_len", 0) or 0) if spec is not None else 0


class TrtllmEngine(Engine):
    """The gateway's engine over `tensorrt_llm.LLM` (checkpoint) or `_tensorrt_engine.LLM` (engine)."""

    def __init__(self, config: EngineConfig) -> None:
        self._api = load_api()  # fails here, at start-up, with the install hint
        self.config = config
        path, default_name = resolve_model(config.model, config.dtype)
        self.folder = ModelFolder.inspect(path, config.tokenizer, config.max_model_len)
        self.tokenizer = Tokenizer.from_pretrained(self.folder.tokenizer_path)
        # TensorRT-LLM leaves a stop token out of its ids unless include_stop_str_in_output (output.py)
        self.outputs = OutputProcessor(self.tokenizer, hides_stop_tokens=False)
        self.adapters = TrtllmAdapters(config.lora_modules, config.max_lora_rank)
        self._llm_class, self.llm_kwargs = llm_arguments(self._api, config, self.folder, self.adapters)
        lora_config = self.llm_kwargs.get("lora_config")
        if lora_config is not None:  # LoRA on (maybe only through trtllm_extra): adapters may be added
            self.adapters.enabled = True
            self.adapters.target_modules = list(lora_config.lora_target_modules) or self.adapters.target_modules
        name = config.served_model_name or default_name
        self.model_info = ModelInfo(name=name, context_window=self.folder.context_window,
                                    vocab_size=self.tokenizer.vocab_size, backend="trtllm",
                                    dtype=config.dtype if config.dtype != "auto" else self.folder.dtype,
                                    device="cuda", max_num_tokens=config.max_num_tokens or TRTLLM_MAX_NUM_TOKENS)
        self._sampling_ctx = SamplingContext(
            context_window=self.folder.context_window, vocab_size=self.folder.vocab_size,
            eos_token_ids=tuple(self.tokenizer.eos_token_ids), default_seed=config.seed,
            default_max_tokens=config.default_max_tokens,
            max_beam_width=config.max_beam_width, speculative="speculative_config" in self.llm_kwargs,
            num_draft_tokens=_draft_len(self.llm_kwargs.get("speculative_config")),
            context_logits=self.folder.context_logits)
        self._stats = StatsCollector(config.max_batch_size, self.model_info.max_num_tokens)
        self.llm: Any = None
        self._results: dict[str, Any] = {}  # request id -> TRT-LLM result, while running
        self._ready = False
        self._prepare = WorkerPool("prepare")  # tokenizing large prompts, off the event loop
        self._poller: asyncio.Task | None = None
        self._submitted = asyncio.Event()  # a request reached TensorRT-LLM since the stats poller last looked

    # -- lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Build the LLM (loads weights or the engine; starts TRT-LLM's workers) and the stats poller."""
        self.llm = self._llm_class(**self.llm_kwargs)
        self._poller = asyncio.get_running_loop().create_task(self._poll_stats())
        self._ready = True

    async def shutdown(self, drain_timeout: float = 0.0) -> None:
        self._ready = False
        deadline = time.monotonic() + drain_timeout
        while self._results and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for request_id in list(self._results):
            self.abort(request_id)
        if self._poller is not None:
            # Cancel, and also stop by flag: a cancellation that lands as a stats item arrives can be
            # swallowed by asyncio.wait_for (Python 3.11), which would leave the poller running.
            self._poller.cancel()
            await asyncio.wait([self._poller], timeout=4 * _STATS_POLL_S)
        if self.llm is not None:
            await asyncio.to_thread(self.llm.shutdown)
            self.llm = None
        self._prepare.shutdown()

    @property
    def ready(self) -> bool:
        return self._ready

    def stats(self) -> EngineStats:
        return self._stats.snapshot(lora_loaded=len(self.adapters.adapters()), in_flight=len(self._results))

    def lora_adapters(self) -> dict[str, str] | None:
        return self.adapters.adapters()

    async def load_lora_adapter(self, name: str, path: str) -> None:
        self.adapters.add(name, path)  # TRT-LLM reads the folder on the adapter's first request

    async def unload_lora_adapter(self, name: str) -> None:
        self.adapters.remove(name)  # running requests keep their LoRARequest; TRT-LLM's LRU evicts it

    def abort(self, request_id: str) -> None:
        result = self._results.get(request_id)
        if result is not None and not result.finished:
            result.abort()

    async def _poll_stats(self) -> None:
        """Read iteration stats as they come. TensorRT-LLM's get_stats_async hands out one shared result
        that exists only after the first request (before it, every call prints a warning) and that, once a
        read times out, stays ended until the next request is submitted; so wait for a submission, then read
        without a timeout: the stream never ends on its own, and a long request keeps its stats."""
        while self._ready:
            await self._submitted.wait()
            self._submitted.clear()
            try:
                async for stat in self.llm.get_stats_async(timeout=None):
                    self._stats.absorb(stat)
                    if not self._ready:
                        return
            except asyncio.CancelledError:
                raise
            except Exception:  # stats are best effort; a failing read must not stop serving
                await asyncio.sleep(_STATS_POLL_S)

    # -- generation ----------------------------------------------------------------------------------

    def generate(self, request: GenerationRequest) -> AsyncIterator[OutputDelta]:
        return self._generate(request)

    def _prompt_ids(self, request: GenerationRequest) -> list[int]:
        if request.prompt_token_ids is not None:
            ids = list(request.prompt_token_ids)
            bad = [t for t in ids if not 0 <= t < self.folder.vocab_size]
            if bad:
                raise InvalidRequestError(f"prompt token id {bad[0]} is outside the vocabulary", "prompt")
        elif request.prompt is not None:
            self.tokenizer.check_fits(request.prompt, self.model_info.context_window)
            ids = self.tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens)
        else:
            raise InvalidRequestError("a prompt is required", "prompt")
        if not ids:
            raise InvalidRequestError("the prompt is empty", "prompt")
        return ids

    def _submit(self, request: GenerationRequest, prompt: list[int]) -> Any:
        if not self._ready:
            raise EngineNotReadyError("The engine is not ready.")
        if len(self._results) >= self.config.max_batch_size + self.config.max_queue_size:
            raise QueueFullError(f"The request queue is full ({self.config.max_queue_size} waiting).")
        if request.request_id in self._results:
            raise InvalidRequestError(f"request id {request.request_id} is already running", "request_id")
        try:  # LoRARequest, SamplingParams and generate_async check their arguments with ValueError
            lora = self.adapters.request(self._api, request.adapter, request.lora_task)
            params = build_sampling_params(self._api, request, len(prompt), self._sampling_ctx)
            result = self.llm.generate_async(prompt, sampling_params=params, lora_request=lora,
                                             streaming=True)
        except EngineError:
            raise
        except (ValueError, TypeError) as exc:  # TRT-LLM's own argument checks
            raise InvalidRequestError(str(exc)) from exc
        except Exception as exc:
            raise EngineFailedError(f"TensorRT-LLM rejected the request: {exc}") from exc
        self._results[request.request_id] = result
        self._submitted.set()
        self._stats.count_request(len(prompt), lora.lora_name if lora is not None else None)
        return result

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[OutputDelta]:
        prompt = await self._prepare.call(is_heavy(request), self._prompt_ids, request)
        result = self._submit(request, prompt)
        options = request.sampling
        count = options.beam_width if options.beam_width > 1 else options.n
        seqs = [SequenceStream(options, request.request_id, i, self.tokenizer.eos_token_ids) for i in range(count)]
        text = self.outputs.add_request(request, prompt)
        stopped: set[int] = set()  # samples a stop string ended in the OutputProcessor
        first, aborted = True, False
        try:
            updates = result.__aiter__()
            while True:
                ended = False
                try:
                    timeout = None if request.deadline is None else max(0.0, request.deadline - time.monotonic())
                    await asyncio.wait_for(updates.__anext__(), timeout)
                    deltas = self._deltas(result, seqs, options.beam_width > 1)
                except StopAsyncIteration:  # ended without finishing every sequence (aborted elsewhere)
                    ended, deltas = True, [d for s in seqs if (d := s.finish("abort"))]
                except asyncio.TimeoutError:  # past the request's deadline
                    result.abort()
                    aborted, ended = True, True
                    deltas = [d for s in seqs if (d := s.finish("abort"))]
                if first and (deltas or result.finished or ended):
                    deltas = deltas or [OutputDelta(request.request_id)]
                    self._first(deltas[0], prompt, result, options.prompt_logprobs)
                    first = False
                done = ended or all(s.finished for s in seqs)
                if done and not result.finished and not aborted:
                    result.abort()  # every sequence ended (n > 1: on stop ids, before TRT-LLM's last response)
                    aborted = True
                if done and deltas:
                    self._last(deltas, seqs, prompt, result)
                deltas, ended_here = text.process(deltas)
                stopped.update(ended_here)
                if not done and not aborted and all(s.finished or s.index in stopped for s in seqs):
                    result.abort()  # every sample ended on a stop string: free TRT-LLM's slots now; its last
                    aborted = True  # response (cancelled) ends the request
                for delta in deltas:
                    yield delta
                if done:
                    return
        finally:
            self._results.pop(request.request_id, None)
            if not result.finished and not aborted:
                result.abort()  # the consumer went away (client disconnect) or shutdown

    @staticmethod
    def _first(delta: OutputDelta, prompt: list[int], result: Any, prompt_logprobs: int | None) -> None:
        delta.prompt_token_ids = prompt
        if prompt_logprobs is not None:  # on the outputs a response has updated (one per response)
            rows = next((out.prompt_logprobs for out in result.outputs if out.prompt_logprobs), None)
            delta.prompt_logprobs = convert_prompt_logprobs(prompt, rows, prompt_logprobs)

    def _deltas(self, result: Any, seqs: list[SequenceStream], beam: bool) -> list[OutputDelta]:
        outputs = result.outputs
        if beam:  # beams are rewritten every step: deliver them whole at the end
            if not result.finished:
                return []
            deltas = []
            for seq, out in zip(seqs, outputs):
                seq.finished = True
                seq.num_tokens = len(out.token_ids)
                deltas.append(OutputDelta(
                    request_id=seq.request_id, index=seq.index, token_ids=list(out.token_ids),
                    finish_reason="length" if out.finish_reason == "length" else "stop",
                    cumulative_logprob=out.cumulative_logprob))
            self._stats.count_generated(sum(len(d.token_ids) for d in deltas))
            return deltas
        deltas = [d for seq, out in zip(seqs, outputs) if (d := seq.update(out)) is not None]
        if result.finished:  # sequences that ended before the last response carry no finish reason
            deltas += [d for seq in seqs if (d := seq.close(result.sampling_params.max_tokens)) is not None]
        self._stats.count_generated(sum(len(d.token_ids) for d in deltas))
        return deltas

    def _last(self, deltas: list[OutputDelta], seqs: list[SequenceStream], prompt: list[int],
              result: Any) -> None:
        """Attach the request's final extras (usage, logits) to its last delta."""
        last = deltas[-1]
        last.usage = Usage(prompt_tokens=len(prompt), completion_tokens=sum(s.num_tokens for s in seqs),
                           cached_tokens=int(getattr(result, "cached_tokens", 0) or 0))
        if result.context_logits is not None:
            last.context_logits = result.context_logits
        for delta in deltas:
            if delta.finish_reason is not None and delta.index < len(result.outputs):
                logits = result.outputs[delta.index].generation_logits
                if logits is not None:
                    delta.generation_logits = logits
