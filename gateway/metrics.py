"""Prometheus metrics of the gateway, in the app's own CollectorRegistry.

Request counters and latency histograms are observed by the gateway as requests flow; engine gauges
(queue, running, KV blocks) are read from `engine.stats()` at scrape time by a custom collector, so
they are never stale and cost nothing between scrapes. Under --data-parallel-size the same gauges also come per
engine core, as trtllm_gateway_engine_core_*{core="i"}, with each core's up and queued tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.triton_metrics import exposition
from runtime.engine import CoreStats, Engine, EngineStats

PREFIX = "trtllm_gateway_"
log = logging.getLogger("gateway.metrics")

# Latency buckets in seconds: sub-millisecond token gaps (GPU) up to minute-long CPU generations.
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
_REQUEST_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)


class EngineStatsCollector(Collector):
    """Reads engine.stats() on every scrape and exposes it as gauges/counters."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        try:
            s = self._engine.stats()
        except Exception:  # a scrape must not fail because the engine is loading or gone
            log.debug("engine.stats() failed during scrape", exc_info=True)
            return
        for name, (doc, value) in _load_gauges(s).items():
            yield GaugeMetricFamily(PREFIX + name, doc, value=value)
        yield GaugeMetricFamily(PREFIX + "kv_tokens_per_block", "Tokens per KV cache block.",
                                value=s.kv_tokens_per_block)
        counters = {
            "engine_iterations": ("Engine steps since start.", s.iterations),
            "engine_eager_iterations": ("Engine steps run op by op, not replayed from CUDA graphs or a compiled step.",
                                        s.eager_iterations),
            "preemptions": ("Sequences preempted since start.", s.preemptions),
            "prefix_cache_hit_tokens": ("Prompt tokens served from the prefix cache.", s.prefix_cache_hit_tokens),
        }
        counters["lora_cache_hits"] = ("LoRA requests that found their adapter in a device slot.", s.lora_cache_hits)
        counters["lora_cache_misses"] = ("LoRA requests whose adapter was copied into a device slot.",
                                         s.lora_cache_misses)
        counters["lora_evictions"] = ("LoRA adapters evicted from a device slot for another.", s.lora_evictions)
        counters["spec_draft_tokens"] = ("Speculative tokens proposed (draft model or n-gram).", s.spec_draft_tokens)
        counters["spec_accepted_tokens"] = ("Speculative tokens accepted by the target model.", s.spec_accepted_tokens)
        counters["spec_steps"] = ("Sequence-steps that verified a speculative proposal.", s.spec_steps)
        # derived from the counters since start (0 before any speculation)
        yield GaugeMetricFamily(PREFIX + "spec_acceptance_rate", "Accepted / proposed speculative tokens.",
                                value=s.spec_accepted_tokens / s.spec_draft_tokens if s.spec_draft_tokens else 0.0)
        yield GaugeMetricFamily(PREFIX + "spec_mean_accepted_length",
                                "Mean accepted draft tokens per speculative step (the target adds one more).",
                                value=s.spec_accepted_tokens / s.spec_steps if s.spec_steps else 0.0)
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(PREFIX + name, doc, value=value)
        yield GaugeMetricFamily(PREFIX + "lora_adapters_loaded", "LoRA adapters the engine can serve.",
                                value=s.lora_loaded)
        per_adapter = CounterMetricFamily(PREFIX + "lora_requests", "Requests per LoRA adapter.", labels=["adapter"])
        for adapter, count in sorted(s.lora_requests.items()):
            per_adapter.add_metric([adapter], count)
        yield per_adapter
        yield from _per_core(self._engine.core_stats())


def _load_gauges(s: EngineStats) -> dict[str, tuple[str, int]]:
    """The gauges of requests and KV blocks, by name: (help, value)."""
    return {
        "requests_running": ("Requests holding KV blocks (prefilling or decoding).", s.running),
        "requests_waiting": ("Requests queued, not yet scheduled.", s.waiting),
        "requests_paused": ("Preempted requests waiting to resume.", s.paused),
        "kv_blocks_used": ("KV cache blocks in use.", s.kv_blocks_used),
        "kv_blocks_free": ("KV cache blocks free.", s.kv_blocks_free),
        "kv_blocks_total": ("KV cache blocks in the pool.", s.kv_blocks_total),
    }


def _per_core(cores: list[CoreStats]) -> Iterator[Metric]:
    """Each engine core's figures under --data-parallel-size, labelled core="0", "1", ... (nothing for one core):
    which core is down, which is loaded. The unlabelled families above are their sums over the live cores."""
    if not cores:
        return
    families = {
        "up": GaugeMetricFamily(PREFIX + "engine_core_up", "1 while the engine core takes requests; 0 while it starts "
                                "or stops, or once it failed.", labels=["core"]),
        "queued_tokens": GaugeMetricFamily(PREFIX + "engine_core_queued_tokens",
                                           "Tokens the router counts on the core (prompt + most tokens to generate "
                                           "of its unfinished requests); the next request goes to the fewest.",
                                           labels=["core"]),
    }
    for index, core in enumerate(cores):
        label = [str(index)]
        families["up"].add_metric(label, int(core.up))
        families["queued_tokens"].add_metric(label, core.queued_tokens)
        for name, (doc, value) in _load_gauges(core.stats).items():
            if name not in families:
                families[name] = GaugeMetricFamily(PREFIX + "engine_core_" + name, doc.rstrip(".") + ", per engine core.",
                                                   labels=["core"])
            families[name].add_metric(label, value)
    yield from families.values()


class GatewayMetrics:
    """All gateway metrics; `registry` is what GET /metrics exposes (Triton's collectors join it)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter(PREFIX + "requests", "HTTP requests by endpoint and status.",
                                ["endpoint", "status"], registry=r)
        self.time_to_first_token = Histogram(PREFIX + "time_to_first_token_seconds",
                                             "Arrival to first generated token.", buckets=_TOKEN_BUCKETS, registry=r)
        self.inter_token_latency = Histogram(PREFIX + "inter_token_latency_seconds",
                                             "Gap between consecutive outputs of one sequence.",
                                             buckets=_TOKEN_BUCKETS, registry=r)
        self.e2e_latency = Histogram(PREFIX + "e2e_request_latency_seconds",
                                     "Arrival to the last output of a generation.",
                                     buckets=_REQUEST_BUCKETS, registry=r)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens of finished generations.",
                                     registry=r)
        self.generation_tokens = Counter(PREFIX + "generation_tokens",
                                         "Tokens generated by finished generations.", registry=r)

    def watch_engine(self, engine: Engine) -> None:
        """Expose `engine.stats()` on every scrape."""
        self.registry.register(EngineStatsCollector(engine))

    def exposition(self) -> bytes:
        """The text exposition format of everything in the registry (Triton's counters under their names)."""
        return exposition(self.registry)
