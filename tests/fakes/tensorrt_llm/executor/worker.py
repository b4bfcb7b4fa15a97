"""TorchEngine: the fake's runtime for the PyTorch-backend LLM, in the place of TensorRT-LLM's PyExecutor.

It runs a Hugging Face checkpoint with transformers on the CPU, one token per running sequence per iteration,
and answers as the C++ executor does (tensorrt_llm/bindings/executor.py): one Response per sequence, with the
new token when streaming (all of the sequence's tokens at its end otherwise); an end id ends a sequence
without being output, a stop word ends it with the word output (the result handler cuts it); `is_final` only
on the last response of a request. Requests take the bad and stop words the worker's _enqueue_request built
with SamplingParams._get_bad_words / _get_stop_words (base_worker.py @ 7b437aaa73bf), and
`end_id=-1` with ignore_eos, as there. Each iteration yields one iteration-stats dict when stats are on.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch

from tensorrt_llm import _sampler
from tensorrt_llm._guided import GuidedDecoder
from tensorrt_llm.bindings.executor import FinishReason, Response, Result
from tensorrt_llm.executor.result import Logprob


@dataclass
class _Sequence:
    tokens: List[int] = field(default_factory=list)
    logprobs: List[Dict[int, Logprob]] = field(default_factory=list)
    cum_logprob: float = 0.0
    finish: Optional[FinishReason] = None
    reported_final: bool = False
    logits: List[torch.Tensor] = field(default_factory=list)
    matcher: Any = None  # the sequence's grammar matcher (guided decoding)


@dataclass
class EngineRequest:
    """What the worker enqueues for one request (the fields of tllm.Request the fake honours)."""

    client_id: int
    prompt: List[int]
    sp: Any  # SamplingParams
    streaming: bool
    end_id: int  # -1: none (ignore_eos)
    bad_words: List[List[int]]
    stop_words: List[List[int]]
    seqs: List[_Sequence] = field(default_factory=list)
    generators: List[torch.Generator] = field(default_factory=list)
    started: bool = False
    aborted: bool = False


class TorchEngine:
    """In-flight batching over a transformers model: `step()` advances every running request by one token."""

    def __init__(self, model_path: str, tokenizer: Any, max_batch_size: int, max_num_tokens: int,
                 tokens_per_block: int, max_kv_tokens: Optional[int], stats_on: bool) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32,
                                                          local_files_only=True).eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.max_num_tokens = max_num_tokens
        self.tokens_per_block = tokens_per_block
        self.max_kv_tokens = max_kv_tokens or 4096
        self.stats_on = stats_on
        self._guided: Optional[GuidedDecoder] = None  # made on the first guided request
        self._requests: Dict[int, EngineRequest] = {}
        self._lock = threading.Lock()
        self._iter = 0

    @property
    def has_work(self) -> bool:
        return bool(self._requests)

    def enqueue(self, request: EngineRequest) -> None:
        sp = request.sp
        request.seqs = [_Sequence() for _ in range(sp.best_of)]
        for i in range(sp.best_of):
            g = torch.Generator()
            g.manual_seed((sp.seed or 0) + i)  # the runtime's default seed is 0
            request.generators.append(g)
        with self._lock:
            self._requests[request.client_id] = request

    def abort(self, client_id: int) -> None:
        with self._lock:
            request = self._requests.get(client_id)
            if request is not None:
                request.aborted = True

    # -- one iteration (runs in a worker thread) -------------------------------------------------------

    def step(self) -> Tuple[List[Response], Optional[dict]]:
        with self._lock:
            order = list(self._requests.values())
        running, queued = order[: self.max_batch_size], order[self.max_batch_size:]
        ctx_reqs = sum(not r.started for r in running)
        ctx_tokens = sum(len(r.prompt) for r in running if not r.started)
        responses: List[Response] = []
        for request in running:
            responses += self._step_request(request)
        self._iter += 1
        stats = self._stat_dict(len(running), len(queued), ctx_reqs, ctx_tokens) if self.stats_on else None
        return responses, stats

    @torch.no_grad()
    def _logits(self, ids: List[int]) -> torch.Tensor:
        return self.model(input_ids=torch.tensor([ids])).logits[0].float()

    def _step_request(self, req: EngineRequest) -> List[Response]:
        sp, first = req.sp, not req.started
        req.started = True
        context_logits = self._logits(req.prompt) if first and (sp.return_context_logits or sp.prompt_logprobs) \
            else None
        advanced: Dict[int, List[int]] = {}
        for i, seq in enumerate(req.seqs):
            if seq.finish is not None:
                continue
            if req.aborted:
                seq.finish = FinishReason.CANCELLED
                advanced[i] = []
            else:
                advanced[i] = self._advance(req, i, seq)
        responses = []
        for i, new_tokens in advanced.items():
            seq = req.seqs[i]
            if not req.streaming and seq.finish is None:
                continue  # without streaming a sequence answers once, at its end
            seq.reported_final = seq.finish is not None
            generation_logits = None
            if seq.finish is not None and sp.return_generation_logits and seq.logits:
                generation_logits = torch.stack(seq.logits)[None]
            result = Result(
                is_final=all(s.reported_final for s in req.seqs), sequence_index=i,
                output_token_ids=[new_tokens if req.streaming else list(seq.tokens)],
                finish_reasons=[seq.finish or FinishReason.NOT_FINISHED],
                cum_log_probs=[seq.cum_logprob] if sp.logprobs else None,
                log_probs=[list(seq.logprobs)] if sp.logprobs else None,
                context_logits=context_logits, generation_logits=generation_logits, decoding_iter=self._iter)
            context_logits = None  # the context phase's logits come once
            responses.append(Response(req.client_id, result))
        if all(s.reported_final for s in req.seqs):
            with self._lock:
                del self._requests[req.client_id]
        return responses

    def _advance(self, req: EngineRequest, i: int, seq: _Sequence) -> List[int]:
        """Sample one token for sequence `i`: the tokens it outputs now (none when it hit the end id)."""
        sp = req.sp
        raw = self._logits(req.prompt + seq.tokens)[-1]
        ends = [req.end_id] if req.end_id >= 0 else []
        blocked = ends + list(sp.stop_token_ids or []) if len(seq.tokens) < (sp.min_tokens or 0) else []
        x = _sampler.processed_logits(raw, sp, req.bad_words, req.prompt, seq.tokens, blocked)
        if sp.guided_decoding is not None:
            if self._guided is None:
                self._guided = GuidedDecoder(self.tokenizer, x.shape[-1], [self.tokenizer.eos_token_id])
            if seq.matcher is None:
                seq.matcher = self._guided.matcher(sp.guided_decoding)
            self._guided.mask(seq.matcher, x)
        token = _sampler.choose(x, sp, req.generators[i])
        if seq.matcher is not None and not seq.matcher.is_terminated():
            seq.matcher.accept_token(token)
        if sp.return_generation_logits:
            seq.logits.append(raw)
        if token in ends:
            seq.finish = FinishReason.END_ID
            return []
        seq.tokens.append(token)
        if sp.logprobs:
            row = {t: Logprob(lp, rank) for t, (lp, rank) in _sampler.top_logprobs(raw, token, sp.logprobs).items()}
            seq.logprobs.append(row)
            seq.cum_logprob += row[token].logprob
        if any(word and seq.tokens[-len(word):] == word for word in req.stop_words):
            seq.finish = FinishReason.STOP_WORDS
        elif len(seq.tokens) >= sp.max_tokens:
            seq.finish = FinishReason.LENGTH
        return [token]

    def _stat_dict(self, running: int, queued: int, ctx_reqs: int, ctx_tokens: int) -> dict:
        per_block = self.tokens_per_block
        total = self.max_kv_tokens // per_block
        with self._lock:
            active = [r for r in self._requests.values() if r.started]
        used = sum(-(-(len(r.prompt) + max(len(s.tokens) for s in r.seqs)) // per_block) * len(r.seqs)
                   for r in active)
        return {"iter": self._iter - 1, "iterLatencyMS": 0.0, "numActiveRequests": running,
                "numQueuedRequests": queued, "numCompletedRequests": 0,
                "maxNumActiveRequests": self.max_batch_size, "maxBatchSizeRuntime": self.max_batch_size,
                "maxNumTokensRuntime": self.max_num_tokens,
                "gpuMemUsage": 0, "cpuMemUsage": sum(p.numel() * 4 for p in self.model.parameters()),
                "pinnedMemUsage": 0,
                "kvCacheStats": {"maxNumBlocks": total, "freeNumBlocks": total - used, "usedNumBlocks": used,
                                 "tokensPerBlock": per_block, "allocTotalBlocks": used, "allocNewBlocks": 0,
                                 "reusedBlocks": 0, "missedBlocks": 0, "cacheHitRate": 0.0},
                "inflightBatchingStats": {"numScheduledRequests": running, "numContextRequests": ctx_reqs,
                                          "numGenRequests": running - ctx_reqs, "numPausedRequests": 0,
                                          "numCtxTokens": ctx_tokens, "microBatchId": 0,
                                          "avgNumDecodedTokensPerIter": 1.0}}
