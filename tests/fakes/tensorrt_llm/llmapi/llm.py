"""The fake LLM (real: NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm.py @ 4c05a74891e4df8066f08ed4ce14b0972abe4e25,
classes LLM (= _TorchLLM) and _TrtLLM).

Constructor, generate_async, get_stats, get_stats_async and shutdown have the real signatures. The
PyTorch-backend LLM loads the Hugging Face checkpoint in `model` with transformers on the CPU and runs
an in-flight batching loop on the event loop: each iteration gives every running sequence (up to
max_batch_size requests) one token, pushes an update to its GenerationResult, and records an
iteration-stats dict (when enable_iter_perf_stats, as in the real PyTorch backend).
Not modelled: beam search, LoRA weights (adapters are validated, not applied), speculative decoding
(configs are validated, then decoding is plain), TensorRT engines (construction only). Guided decoding
is modelled with xgrammar as the real PyTorch backend does it (tensorrt_llm/_guided.py).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Literal, Optional, Union

import torch

from tensorrt_llm import _sampler
from tensorrt_llm._guided import GuidedDecoder
from tensorrt_llm.executor.request import LoRARequest
from tensorrt_llm.executor.result import GenerationResult, IterationResult, Logprob
from tensorrt_llm.llmapi.llm_args import (TORCH_LLM_ARGS, TRT_LLM_ARGS, CudaGraphConfig,
                                          DecodingBaseConfig, KvCacheConfig, SchedulerConfig)
from tensorrt_llm.lora_helper import LoraConfig
from tensorrt_llm.sampling_params import SamplingParams

RequestOutput = GenerationResult

_TYPED_ARGS = {"kv_cache_config": KvCacheConfig, "scheduler_config": SchedulerConfig,
               "lora_config": LoraConfig, "speculative_config": DecodingBaseConfig,
               "cuda_graph_config": CudaGraphConfig}


@dataclass
class _Seq:
    tokens: List[int] = field(default_factory=list)
    done: bool = False
    logits: List[torch.Tensor] = field(default_factory=list)
    matcher: Any = None  # the sequence's grammar matcher (guided decoding)


@dataclass
class _Request:
    result: GenerationResult
    prompt: List[int]
    sp: SamplingParams
    seqs: List[_Seq]
    generators: List[torch.Generator]
    started: bool = False
    aborted: bool = False


class BaseLLM:
    """Shared constructor checks of both LLM classes."""

    _valid_args: frozenset[str] = TORCH_LLM_ARGS

    def __init__(self, model: Union[str, Path], tokenizer: Optional[Union[str, Path, Any]] = None,
                 tokenizer_mode: Literal["auto", "slow"] = "auto", skip_tokenizer_init: bool = False,
                 trust_remote_code: bool = False, tensor_parallel_size: int = 1, dtype: str = "auto",
                 revision: Optional[str] = None, tokenizer_revision: Optional[str] = None,
                 **kwargs: Any) -> None:
        for key in kwargs:
            if key not in self._valid_args:
                raise ValueError(f"{self.__class__.__name__} got invalid argument: {key}")
        for key, cls in _TYPED_ARGS.items():
            if kwargs.get(key) is not None and not isinstance(kwargs[key], cls):
                raise ValueError(f"{key} must be a {cls.__name__}, got {type(kwargs[key]).__name__}")
        self.args = dict(model=str(model), tokenizer=tokenizer, tokenizer_mode=tokenizer_mode,
                         skip_tokenizer_init=skip_tokenizer_init, trust_remote_code=trust_remote_code,
                         tensor_parallel_size=tensor_parallel_size, dtype=dtype, revision=revision,
                         tokenizer_revision=tokenizer_revision, **kwargs)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer or model), local_files_only=True)
        self.max_batch_size = kwargs.get("max_batch_size") or 2048
        self._kv = kwargs.get("kv_cache_config") or KvCacheConfig()
        self._stats_on = bool(kwargs.get("enable_iter_perf_stats"))
        self._ids = itertools.count(1)
        self._requests: dict[int, _Request] = {}
        self._stats: Optional[asyncio.Queue[dict]] = None
        self._wake: Optional[asyncio.Event] = None
        self._loop_task: Optional[asyncio.Task] = None
        self._iter = 0
        self._shutdown = False

    # -- the public API ----------------------------------------------------------------------------

    def generate_async(self, inputs: Any, sampling_params: Optional[SamplingParams] = None,
                       lora_request: Optional[LoRARequest] = None,
                       prompt_adapter_request: Optional[Any] = None, streaming: bool = False,
                       kv_cache_retention_config: Optional[Any] = None,
                       disaggregated_params: Optional[Any] = None, _postproc_params: Optional[Any] = None,
                       scheduling_params: Optional[Any] = None,
                       cache_salt: Optional[str] = None) -> RequestOutput:
        """Submit one prompt (text, token ids or {"prompt_token_ids": [...]}) and return its result."""
        if self._shutdown:
            raise RuntimeError("LLM is shutting down")
        sp = sampling_params or SamplingParams()
        if sp.end_id is None:
            sp._setup(self.tokenizer)
        elif sp._stop_word_ids is None:
            sp._setup(self.tokenizer)
        prompt = self._prompt_ids(inputs, sp)
        self._check(prompt, sp, lora_request)
        rid = next(self._ids)
        result = GenerationResult(rid, prompt, sp, streaming, self._abort)
        gens = []
        for i in range(sp.best_of):
            g = torch.Generator()
            g.manual_seed((sp.seed or 0) + i)  # the runtime's default seed is 0
            gens.append(g)
        self._requests[rid] = _Request(result, prompt, sp, [_Seq() for _ in range(sp.best_of)], gens)
        self._ensure_loop()
        self._wake.set()
        return result

    def get_stats(self, timeout: Optional[float] = 2) -> List[dict]:
        """Iteration stats collected since the last call (the fake never blocks)."""
        out = []
        while self._stats is not None and not self._stats.empty():
            out.append(self._stats.get_nowait())
        return out

    def get_stats_async(self, timeout: Optional[float] = 2) -> IterationResult:
        """Async iterable over iteration stats; ends after `timeout` seconds without a new one."""
        self._ensure_loop()
        return IterationResult(self._stats, timeout)

    def shutdown(self) -> None:
        self._shutdown = True
        if self._loop_task is not None:
            # The real shutdown blocks (it joins its workers), so callers run it in a thread: cancel
            # thread-safely, or the event loop would not wake up to process the cancellation.
            self._loop_task.get_loop().call_soon_threadsafe(self._loop_task.cancel)

    def __enter__(self) -> "BaseLLM":
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.shutdown()
        return False

    # -- internals -----------------------------------------------------------------------------------

    def _prompt_ids(self, inputs: Any, sp: SamplingParams) -> List[int]:
        if isinstance(inputs, dict):
            inputs = inputs.get("prompt_token_ids", inputs.get("prompt"))
        if isinstance(inputs, str):
            return list(self.tokenizer.encode(inputs, add_special_tokens=sp.add_special_tokens))
        if isinstance(inputs, list) and all(isinstance(t, int) for t in inputs):
            return list(inputs)
        raise TypeError(f"The inputs must be type str or list of int, but got {type(inputs)}")

    def _check(self, prompt: List[int], sp: SamplingParams, lora: Optional[LoRARequest]) -> None:
        if sp.n > self.max_batch_size:
            raise ValueError(f"SamplingParams.n ({sp.n}) should not exceed max_batch_size")
        if sp.use_beam_search:
            raise NotImplementedError("the fake tensorrt_llm does not implement beam search")
        if lora is not None and self.args.get("lora_config") is None:
            raise ValueError("LoRA request given but the LLM was built without lora_config")
        if sp.guided_decoding is not None and self.args.get("guided_decoding_backend") is None:
            raise ValueError("guided decoding needs guided_decoding_backend")

    def _abort(self, request_id: int) -> None:
        req = self._requests.get(request_id)
        if req is not None:
            req.aborted = True
            self._wake.set()

    def _post(self, queue: asyncio.Queue, item: Any) -> None:
        """Queue `item` from the iteration thread (asyncio queues are not thread-safe)."""
        self._loop_task.get_loop().call_soon_threadsafe(queue.put_nowait, item)

    def _ensure_loop(self) -> None:
        if self._loop_task is None:
            self._stats = asyncio.Queue()
            self._wake = asyncio.Event()
            self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while not self._shutdown:
            if not self._requests:
                self._wake.clear()
                await self._wake.wait()
                continue
            # Off the event loop, as the real runtime works in its own threads/processes: the
            # server keeps serving (disconnects, health, metrics) while the model computes.
            await asyncio.to_thread(self._iteration)
            await asyncio.sleep(0)

    def _iteration(self) -> None:
        raise NotImplementedError("a TensorRT engine cannot run in the fake tensorrt_llm")


class _TorchLLM(BaseLLM):
    """PyTorch-backend LLM over a Hugging Face checkpoint folder."""

    def __init__(self, model: Union[str, Path], tokenizer: Optional[Union[str, Path, Any]] = None,
                 tokenizer_mode: Literal["auto", "slow"] = "auto", skip_tokenizer_init: bool = False,
                 trust_remote_code: bool = False, tensor_parallel_size: int = 1, dtype: str = "auto",
                 revision: Optional[str] = None, tokenizer_revision: Optional[str] = None,
                 **kwargs: Any) -> None:
        super().__init__(model, tokenizer, tokenizer_mode, skip_tokenizer_init, trust_remote_code,
                         tensor_parallel_size, dtype, revision, tokenizer_revision, **kwargs)
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(model), torch_dtype=torch.float32,
                                                          local_files_only=True).eval()
        self._guided: Optional[GuidedDecoder] = None  # made on the first guided request

    @torch.no_grad()
    def _logits(self, ids: List[int]) -> torch.Tensor:
        return self.model(input_ids=torch.tensor([ids])).logits[0].float()

    def _iteration(self) -> None:
        order = list(self._requests.values())
        running, queued = order[: self.max_batch_size], order[self.max_batch_size:]
        ctx_reqs = sum(not r.started for r in running)
        ctx_tokens = sum(len(r.prompt) for r in running if not r.started)
        for req in running:
            self._step(req)
        self._iter += 1
        if self._stats_on:
            self._post(self._stats, self._stat_dict(len(running), len(queued), ctx_reqs, ctx_tokens))

    def _step(self, req: _Request) -> None:
        sp, first = req.sp, not req.started
        req.started = True
        new: dict[int, tuple] = {}
        if req.aborted:
            for i, seq in enumerate(req.seqs):
                if not seq.done:
                    seq.done = True
                    new[i] = ([], [], "cancelled", None, 0)
        else:
            for i, seq in enumerate(req.seqs):
                if not seq.done:
                    new[i] = self._advance(req, i, seq)
        done = all(s.done for s in req.seqs)
        ctx = self._logits(req.prompt) if first and (sp.return_context_logits or sp.prompt_logprobs) else None
        if done:
            del self._requests[req.result.request_id]

        def apply(result: GenerationResult) -> None:
            for i, (ids, lps, reason, stop_reason, trim) in new.items():
                out = result._outputs[i]
                out.token_ids.extend(ids)
                if trim:
                    del out.token_ids[-trim:]
                if sp.logprobs is not None:
                    out.logprobs.extend(lps)
                if lps:
                    out.cumulative_logprob = (out.cumulative_logprob or 0.0) + sum(
                        d[t].logprob for d, t in zip(lps, ids))
                if reason is not None:
                    out.finish_reason, out.stop_reason = reason, stop_reason
                    if sp.return_generation_logits and req.seqs[i].logits:
                        out.generation_logits = torch.stack(req.seqs[i].logits)
                if sp.detokenize:
                    out.text = self.tokenizer.decode(out.token_ids, skip_special_tokens=sp.skip_special_tokens)
            if ctx is not None:
                if sp.return_context_logits:
                    result._context_logits = ctx
                if sp.prompt_logprobs:
                    plp = [_as_logprobs(_sampler.top_logprobs(ctx[p - 1], req.prompt[p], sp.prompt_logprobs))
                           for p in range(1, len(req.prompt))]
                    for out in result._outputs:
                        out.prompt_logprobs = plp
            result._done = done

        self._post(req.result.queue, apply)

    def _advance(self, req: _Request, i: int, seq: _Seq) -> tuple:
        sp = req.sp
        raw = self._logits(req.prompt + seq.tokens)[-1]
        ends = [] if sp.ignore_eos or sp.end_id is None else [sp.end_id]
        blocked = ends + list(sp.stop_token_ids or []) if len(seq.tokens) < (sp.min_tokens or 0) else []
        x = _sampler.processed_logits(raw, sp, req.prompt, seq.tokens, blocked)
        if sp.guided_decoding is not None:
            if self._guided is None:
                self._guided = GuidedDecoder(self.tokenizer, x.shape[-1], [self.tokenizer.eos_token_id])
            if seq.matcher is None:
                seq.matcher = self._guided.matcher(sp.guided_decoding)
            self._guided.mask(seq.matcher, x)
        tok = _sampler.choose(x, sp, req.generators[i])
        if seq.matcher is not None and not seq.matcher.is_terminated():
            seq.matcher.accept_token(tok)
        if sp.return_generation_logits:
            seq.logits.append(raw)
        lps = [_as_logprobs(_sampler.top_logprobs(raw, tok, sp.logprobs))] if sp.logprobs is not None else []
        if tok in ends:
            seq.done = True
            return [], [], "stop", None, 0  # the end id is not part of the output
        seq.tokens.append(tok)
        for reason, word in sp._get_stop_reasons_and_words():
            if word and seq.tokens[-len(word):] == word:
                seq.done = True
                # As the real result handler: the matched words are cut from token_ids at the end.
                trim = 0 if sp.include_stop_str_in_output else len(word)
                if trim:
                    del seq.tokens[-trim:]
                return [tok], lps, "stop", reason, trim
        if len(seq.tokens) >= sp.max_tokens:
            seq.done = True
            return [tok], lps, "length", None, 0
        return [tok], lps, None, None, 0

    def _stat_dict(self, running: int, queued: int, ctx_reqs: int, ctx_tokens: int) -> dict:
        per_block = self._kv.tokens_per_block
        total = (self._kv.max_tokens or 4096) // per_block
        used = sum(-(-(len(r.prompt) + max(len(s.tokens) for s in r.seqs)) // per_block) * len(r.seqs)
                   for r in list(self._requests.values()) if r.started)
        return {"iter": self._iter - 1, "iterLatencyMS": 0.0, "numActiveRequests": running,
                "numQueuedRequests": queued, "numCompletedRequests": 0,
                "maxNumActiveRequests": self.max_batch_size, "maxBatchSizeRuntime": self.max_batch_size,
                "maxNumTokensRuntime": self.args.get("max_num_tokens") or 8192,
                "gpuMemUsage": 0, "cpuMemUsage": sum(p.numel() * 4 for p in self.model.parameters()),
                "pinnedMemUsage": 0,
                "kvCacheStats": {"maxNumBlocks": total, "freeNumBlocks": total - used, "usedNumBlocks": used,
                                 "tokensPerBlock": per_block, "allocTotalBlocks": used, "allocNewBlocks": 0,
                                 "reusedBlocks": 0, "missedBlocks": 0, "cacheHitRate": 0.0},
                "inflightBatchingStats": {"numScheduledRequests": running, "numContextRequests": ctx_reqs,
                                          "numGenRequests": running - ctx_reqs, "numPausedRequests": 0,
                                          "numCtxTokens": ctx_tokens, "microBatchId": 0,
                                          "avgNumDecodedTokensPerIter": 1.0}}


class _TrtLLM(BaseLLM):
    """LLM over a TensorRT engine folder (tensorrt_llm._tensorrt_engine.LLM); construction only."""

    _valid_args = TRT_LLM_ARGS

    def __init__(self, model: Union[str, Path], tokenizer: Optional[Union[str, Path, Any]] = None,
                 tokenizer_mode: Literal["auto", "slow"] = "auto", skip_tokenizer_init: bool = False,
                 trust_remote_code: bool = False, tensor_parallel_size: int = 1, dtype: str = "auto",
                 revision: Optional[str] = None, tokenizer_revision: Optional[str] = None,
                 **kwargs: Any) -> None:
        with open(Path(model) / "config.json", encoding="utf-8") as f:
            if "build_config" not in json.load(f):
                raise ValueError(f"{model} is not a TensorRT engine folder (no build_config)")
        super().__init__(model, tokenizer, tokenizer_mode, skip_tokenizer_init, trust_remote_code,
                         tensor_parallel_size, dtype, revision, tokenizer_revision, **kwargs)


class LLM(_TorchLLM):
    """LLM class is the main class for running a LLM model (PyTorch backend)."""


def _as_logprobs(d: dict) -> dict[int, Logprob]:
    return {t: Logprob(lp, rank) for t, (lp, rank) in d.items()}
