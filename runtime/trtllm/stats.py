"""StatsCollector: TensorRT-LLM iteration stats (LLM.get_stats_async dicts) -> EngineStats.

Keys are those of the C++ IterationStats JSON (numQueuedRequests, kvCacheStats.usedNumBlocks,
inflightBatchingStats.numCtxTokens, specDecodingStats.numAcceptedTokens, ...); see
tests/fakes/trtllm_api_snapshot.json. Per-iteration counts are summed here into the totals EngineStats
reports; prompt and generated token totals are counted by the engine as it serves requests.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from runtime.engine import EngineStats


class StatsCollector:
    """Latest snapshot plus running totals; `absorb` from the poller, `snapshot` from anyone."""

    def __init__(self, max_batch_size: int, max_num_tokens: int) -> None:
        self._lock = threading.Lock()
        self._stats = EngineStats(max_batch_size=max_batch_size, max_num_tokens=max_num_tokens)

    def absorb(self, stat: Any) -> None:
        """Fold one iteration's stats (a dict, or its JSON string as some releases return) in."""
        if isinstance(stat, (str, bytes)):
            stat = json.loads(stat)
        kv = stat.get("kvCacheStats") or {}
        ifb = stat.get("inflightBatchingStats") or {}
        spec = stat.get("specDecodingStats") or {}
        with self._lock:
            s = self._stats
            s.waiting = int(stat.get("numQueuedRequests", s.waiting))
            s.running = int(stat.get("numActiveRequests", s.running))
            s.iterations = max(s.iterations, int(stat.get("iter", s.iterations - 1)) + 1)
            s.max_batch_size = int(stat.get("maxBatchSizeRuntime") or s.max_batch_size)
            s.max_num_tokens = int(stat.get("maxNumTokensRuntime") or s.max_num_tokens)
            memory = {name: int(stat[key]) for name, key in
                      (("gpu", "gpuMemUsage"), ("cpu", "cpuMemUsage"), ("pinned", "pinnedMemUsage"))
                      if key in stat}
            s.memory_bytes = memory or s.memory_bytes
            if kv:
                s.kv_blocks_total = int(kv.get("maxNumBlocks", s.kv_blocks_total))
                s.kv_blocks_used = int(kv.get("usedNumBlocks", s.kv_blocks_used))
                s.kv_blocks_free = int(kv.get("freeNumBlocks", s.kv_blocks_free))
                s.kv_tokens_per_block = int(kv.get("tokensPerBlock", s.kv_tokens_per_block))
                # reusedBlocks is a running count of blocks served from the reuse (prefix) cache
                s.prefix_cache_hit_tokens = int(kv.get("reusedBlocks", 0)) * s.kv_tokens_per_block
            if ifb:
                s.paused = int(ifb.get("numPausedRequests", 0))
                s.scheduled = int(ifb.get("numScheduledRequests", 0))
                s.context_requests = int(ifb.get("numContextRequests", 0))
                s.generation_requests = int(ifb.get("numGenRequests", 0))
                s.context_tokens = int(ifb.get("numCtxTokens", 0))
                s.prefill_tokens_computed += s.context_tokens
            if spec:
                s.spec_draft_tokens += int(spec.get("numDraftTokens", 0))
                s.spec_accepted_tokens += int(spec.get("numAcceptedTokens", 0))
                s.spec_steps += int(spec.get("numRequestsWithDraftTokens", 0) > 0)

    def count_request(self, prompt_tokens: int, adapter: str | None = None) -> None:
        with self._lock:
            self._stats.prompt_tokens_total += prompt_tokens
            if adapter is not None:
                self._stats.lora_requests[adapter] = self._stats.lora_requests.get(adapter, 0) + 1

    def count_generated(self, tokens: int) -> None:
        with self._lock:
            self._stats.generation_tokens_total += tokens

    def snapshot(self, lora_loaded: int = 0, in_flight: int | None = None) -> EngineStats:
        """The latest stats. `in_flight`: requests the engine holds now; TensorRT-LLM reports no
        iteration while idle, so with none in flight the last iteration's occupancy is stale: zero it."""
        with self._lock:
            snap = self._stats.copy()
        snap.lora_loaded = lora_loaded
        if in_flight == 0:
            snap.waiting = snap.running = snap.paused = snap.scheduled = 0
            snap.context_requests = snap.generation_requests = snap.context_tokens = 0
            snap.kv_blocks_free, snap.kv_blocks_used = snap.kv_blocks_total, 0
        return snap
