"""Triton's metric families on the app's /metrics (same registry), with real values.

    metrics = register(registry, engine)            # once, by create_app
    timer = metrics_for(registry).track("ensemble", "1", batch_size=2)   # per inference request
    ... timer.inputs_done(); timer.first_output(); timer.outputs_done(); timer.finish(ok=True)

- nv_trt_llm_* (the backend's custom metrics): read from `engine.stats()` at scrape time, labelled
  model="tensorrt_llm", version="1" as in the backend's docs.
- nv_inference_* (Triton's per-model families): counted by the routes through `track()`, labelled with
  the model name as addressed and its version. Durations are cumulative microsecond counters, as
  Triton's: compute_input = parsing and tokenising the request, queue = until the engine's first output
  (so it includes the prefill), compute_infer = first to last output, compute_output = rendering the
  response. request_success/failure and exec_count count HTTP requests; count counts prompts.
Counters keep Triton's exact names (no `_total` suffix), so existing dashboards keep working. prometheus_client
writes a counter family's HELP and TYPE lines as NAME_total while the samples keep NAME, which Prometheus'
parser reads as an empty counter plus an untyped series; `exposition()` writes NAME on all three, as Triton.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from runtime.engine import Engine

log = logging.getLogger("gateway.triton_metrics")

_COUNTERS = (
    ("request_success", "Number of successful inference requests, all batch sizes"),
    ("request_failure", "Number of failed inference requests, all batch sizes"),
    ("count", "Number of inferences performed (a batch of n prompts counts n)"),
    ("exec_count", "Number of model executions performed (one per request)"),
    ("request_duration_us", "Cumulative inference request duration in microseconds"),
    ("queue_duration_us", "Cumulative time requests waited for the engine's first output, in microseconds"),
    ("compute_input_duration_us", "Cumulative compute input duration in microseconds"),
    ("compute_infer_duration_us", "Cumulative compute inference duration in microseconds"),
    ("compute_output_duration_us", "Cumulative inference compute output duration in microseconds"),
)


@dataclass
class _ModelCounters:
    request_success: float = 0
    request_failure: float = 0
    count: float = 0
    exec_count: float = 0
    request_duration_us: float = 0
    queue_duration_us: float = 0
    compute_input_duration_us: float = 0
    compute_infer_duration_us: float = 0
    compute_output_duration_us: float = 0
    pending: int = 0
    fail_duration_us: float = 0  # of request_duration_us: the failed requests' share (statistics only)
    last_inference_ms: float = 0  # when the last request finished, ms since the epoch (statistics only)


class InferenceTimer:
    """One inference request's phases; `finish()` books them (idempotent)."""

    def __init__(self, owner: TritonMetrics, key: tuple[str, str], batch_size: int) -> None:
        self._owner = owner
        self._key = key
        self.batch_size = batch_size
        self._start = self._inputs = time.monotonic()
        self._first: float | None = None
        self._last: float | None = None
        self._done = False
        owner._update(key, pending=1)

    def inputs_done(self) -> None:
        """The request is parsed and its runtime requests built."""
        self._inputs = time.monotonic()

    def first_output(self) -> None:
        """The engine produced its first output."""
        if self._first is None:
            self._first = time.monotonic()

    def outputs_done(self) -> None:
        """The engine produced its last output (rendering starts)."""
        self._last = time.monotonic()

    def finish(self, ok: bool) -> None:
        if self._done:
            return
        self._done = True
        end = time.monotonic()
        first = self._first if self._first is not None else end
        last = self._last if self._last is not None else end
        us = 1e6
        self._owner._update(
            self._key,
            pending=-1,
            request_success=1 if ok else 0,
            request_failure=0 if ok else 1,
            count=self.batch_size if ok else 0,
            exec_count=1 if ok else 0,
            request_duration_us=(end - self._start) * us,
            fail_duration_us=0.0 if ok else (end - self._start) * us,
            compute_input_duration_us=(self._inputs - self._start) * us,
            queue_duration_us=max(0.0, first - self._inputs) * us,
            compute_infer_duration_us=max(0.0, last - first) * us,
            compute_output_duration_us=max(0.0, end - last) * us,
        )


class TritonMetrics:
    """The nv_inference_* counters per (model, version), and the collector of both families."""

    def __init__(self, engine: Engine, model_name: str = "tensorrt_llm") -> None:
        self.engine = engine
        self.model_name = model_name  # label of the nv_trt_llm_* families
        self._lock = threading.Lock()
        self._models: dict[tuple[str, str], _ModelCounters] = {}

    def track(self, model: str, version: str = "1", batch_size: int = 1) -> InferenceTimer:
        """Start timing one inference request (pending until `finish`)."""
        return InferenceTimer(self, (model, version), batch_size)

    def _update(self, key: tuple[str, str], pending: int = 0, **add: float) -> None:
        with self._lock:
            c = self._models.setdefault(key, _ModelCounters())
            c.pending += pending
            for name, value in add.items():
                setattr(c, name, getattr(c, name) + value)
            if pending < 0:  # a request finished
                c.last_inference_ms = time.time() * 1e3

    def statistics(self, models: list[tuple[str, str]]) -> dict[str, Any]:
        """Triton's statistics document (GET /v2/models[/{m}]/stats) for (name, version) pairs; durations in
        ns; the phases count the successful requests, as Triton's do."""
        snap = self.snapshot()
        stats = []
        for name, version in models:
            c = snap.get((name, version), _ModelCounters())
            ok = int(c.request_success)
            stats.append({
                "name": name, "version": version, "last_inference": int(c.last_inference_ms),
                "inference_count": int(c.count), "execution_count": int(c.exec_count),
                "inference_stats": {
                    "success": _phase(ok, c.request_duration_us - c.fail_duration_us),
                    "fail": _phase(c.request_failure, c.fail_duration_us),
                    "queue": _phase(ok, c.queue_duration_us),
                    "compute_input": _phase(ok, c.compute_input_duration_us),
                    "compute_infer": _phase(ok, c.compute_infer_duration_us),
                    "compute_output": _phase(ok, c.compute_output_duration_us),
                    "cache_hit": _phase(0, 0), "cache_miss": _phase(0, 0)},
                "batch_stats": []})
        return {"model_stats": stats}

    def snapshot(self) -> dict[tuple[str, str], _ModelCounters]:
        with self._lock:
            return {k: _ModelCounters(**vars(v)) for k, v in self._models.items()}


class _TritonCollector(Collector):
    def __init__(self, metrics: TritonMetrics) -> None:
        self._m = metrics

    def describe(self) -> list[Metric]:
        return []  # families depend on live state; skip the registry's duplicate check at register()

    def collect(self) -> Iterator[Metric]:
        yield from self._inference_families()
        yield from self._backend_families()

    def _inference_families(self) -> Iterator[Metric]:
        snap = self._m.snapshot()
        for name, doc in _COUNTERS:
            full = "nv_inference_" + name
            family = Metric(full, doc, "counter")
            for (model, version), c in sorted(snap.items()):
                family.add_sample(full, {"model": model, "version": version}, float(getattr(c, name)))
            yield family
        pending = GaugeMetricFamily("nv_inference_pending_request_count",
                                    "Instantaneous number of pending requests awaiting execution per-model.",
                                    labels=["model", "version"])
        for (model, version), c in sorted(snap.items()):
            pending.add_metric([model, version], c.pending)
        yield pending

    def _backend_families(self) -> Iterator[Metric]:
        try:
            s = self._m.engine.stats()
        except Exception:  # a scrape must not fail because the engine is loading or gone
            log.debug("engine.stats() failed during scrape", exc_info=True)
            return
        fraction = s.kv_blocks_used / s.kv_blocks_total if s.kv_blocks_total else 0.0
        families = (
            ("request_metrics", "TRT LLM request metrics", "request_type", {
                "active": s.running, "max": s.max_batch_size, "scheduled": s.scheduled,
                "context": s.context_requests, "waiting": s.waiting + s.paused}),
            ("runtime_memory_metrics", "TRT LLM runtime memory metrics", "memory_type", {
                t: s.memory_bytes.get(t, 0) for t in ("gpu", "cpu", "pinned")}),
            ("kv_cache_block_metrics", "TRT LLM KV cache block metrics", "kv_cache_block_type", {
                "max": s.kv_blocks_total, "free": s.kv_blocks_free, "used": s.kv_blocks_used,
                "tokens_per": s.kv_tokens_per_block, "fraction": fraction}),
            ("inflight_batcher_metrics", "TRT LLM inflight_batcher-specific metrics",
             "inflight_batcher_specific_metric", {
                 "generation_requests": s.generation_requests, "total_context_tokens": s.context_tokens,
                 # no pipeline parallelism: there is one micro batch, always id 0
                 "micro_batch_id": 0}),
            ("general_metrics", "General TRT LLM metrics", "general_type", {
                "iteration_counter": s.iterations, "timestamp": int(time.time() * 1e6)}),
        )
        for name, doc, label, values in families:
            family = GaugeMetricFamily("nv_trt_llm_" + name, doc, labels=[label, "model", "version"])
            for kind, value in values.items():
                family.add_metric([kind, self._m.model_name, "1"], float(value))
            yield family


# registry -> its TritonMetrics, so routes find theirs through app.state.metrics.registry.
_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, TritonMetrics] = weakref.WeakKeyDictionary()


def register(registry: CollectorRegistry, engine: Engine, model_name: str = "tensorrt_llm") -> TritonMetrics:
    """Add Triton's families to `registry` (the app's /metrics); returns the counters routes update."""
    metrics = TritonMetrics(engine, model_name)
    registry.register(_TritonCollector(metrics))
    _BY_REGISTRY[registry] = metrics
    return metrics


def metrics_for(registry: CollectorRegistry) -> TritonMetrics | None:
    """The TritonMetrics registered on `registry`, if any."""
    return _BY_REGISTRY.get(registry)


def _phase(count: float, us: float) -> dict[str, int]:
    """One phase of Triton's statistics document: a count and its cumulative nanoseconds."""
    return {"count": int(count), "ns": int(us * 1e3)}


def exposition(registry: CollectorRegistry) -> bytes:
    """The text format of `registry`, with the nv_inference_* counters' HELP and TYPE lines under their
    sample names (see the module docstring)."""
    text = generate_latest(registry)
    for name, _ in _COUNTERS:
        full = b"nv_inference_" + name.encode()
        text = text.replace(b"# HELP " + full + b"_total ", b"# HELP " + full + b" ")
        text = text.replace(b"# TYPE " + full + b"_total counter", b"# TYPE " + full + b" counter")
    return text


def start_metrics_server(registry: CollectorRegistry, port: int, host: str = "0.0.0.0") -> None:
    """Serve `registry` on its own port too (Triton's --metrics-port, 8002 by default there), in a thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = exposition(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:  # scrapes are not worth a log line each
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="metrics-port", daemon=True).start()
    log.info("metrics on http://%s:%d/metrics", host, port)
