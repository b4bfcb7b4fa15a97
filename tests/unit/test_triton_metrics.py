"""gateway.triton_metrics: EngineStats -> the nv_trt_llm_* families, the nv_inference_* counters, and
the separate metrics port (Triton's 8002)."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.triton_metrics import exposition, register, start_metrics_server
from runtime.engine import EngineStats
from tests.ports import free_port

STATS = EngineStats(
    waiting=3, running=5, paused=2, scheduled=4, context_requests=1, generation_requests=3, context_tokens=77,
    max_batch_size=16, kv_blocks_total=100, kv_blocks_used=25, kv_blocks_free=75, kv_tokens_per_block=32,
    iterations=1234, memory_bytes={"gpu": 1000, "pinned": 7},
)


class StatsOnly:
    """Just what the collector reads from an engine: stats()."""

    def stats(self) -> EngineStats:
        return STATS


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def value(found: dict, name: str, **labels: str) -> float:
    return found[(name, tuple(sorted({"model": "tensorrt_llm", "version": "1", **labels}.items())))]


def test_backend_families_come_from_engine_stats() -> None:
    registry = CollectorRegistry()
    register(registry, StatsOnly())  # type: ignore[arg-type]
    found = samples(generate_latest(registry).decode())
    req = "nv_trt_llm_request_metrics"
    assert [value(found, req, request_type=t) for t in ("active", "max", "scheduled", "context", "waiting")] == \
        [5, 16, 4, 1, 5]  # waiting counts the paused (preempted) requests too
    kv = "nv_trt_llm_kv_cache_block_metrics"
    assert [value(found, kv, kv_cache_block_type=t) for t in ("max", "free", "used", "tokens_per", "fraction")] == \
        [100, 75, 25, 32, 0.25]
    mem = "nv_trt_llm_runtime_memory_metrics"
    assert [value(found, mem, memory_type=t) for t in ("gpu", "cpu", "pinned")] == [1000, 0, 7]
    ifb = "nv_trt_llm_inflight_batcher_metrics"
    assert [value(found, ifb, inflight_batcher_specific_metric=t)
            for t in ("generation_requests", "total_context_tokens", "micro_batch_id")] == [3, 77, 0]
    gen = "nv_trt_llm_general_metrics"
    assert value(found, gen, general_type="iteration_counter") == 1234
    assert value(found, gen, general_type="timestamp") == pytest.approx(time.time() * 1e6, rel=1e-3)


def test_inference_counters_book_each_phase() -> None:
    registry = CollectorRegistry()
    metrics = register(registry, StatsOnly())  # type: ignore[arg-type]
    ok = metrics.track("ensemble", "1", batch_size=3)
    failed = metrics.track("ensemble", "1")
    pending = samples(generate_latest(registry).decode())
    assert pending[("nv_inference_pending_request_count", (("model", "ensemble"), ("version", "1")))] == 2
    ok.inputs_done()
    ok.first_output()
    ok.outputs_done()
    ok.finish(ok=True)
    ok.finish(ok=False)  # idempotent: booked once
    failed.finish(ok=False)
    found = samples(generate_latest(registry).decode())
    key = (("model", "ensemble"), ("version", "1"))
    got = {name: found[(name, key)] for name in ("nv_inference_request_success", "nv_inference_request_failure",
                                                   "nv_inference_count", "nv_inference_exec_count",
                                                   "nv_inference_pending_request_count")}
    assert got == {"nv_inference_request_success": 1, "nv_inference_request_failure": 1, "nv_inference_count": 3,
                   "nv_inference_exec_count": 1, "nv_inference_pending_request_count": 0}
    assert found[("nv_inference_request_duration_us", key)] > 0


def test_metrics_port_serves_the_same_registry() -> None:
    registry = CollectorRegistry()
    register(registry, StatsOnly())  # type: ignore[arg-type]
    port = free_port()
    start_metrics_server(registry, port, "127.0.0.1")
    r = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert value(samples(r.text), "nv_trt_llm_general_metrics", general_type="iteration_counter") == 1234
    assert "# TYPE nv_inference_count counter\n" in r.text  # Triton's counter names there too (exposition())


def test_counters_are_written_under_tritons_names_and_parse_as_counters() -> None:
    """`# TYPE nv_inference_count counter` above `nv_inference_count{...}` samples, as Triton writes them;
    prometheus_client's own text format put `_total` on the HELP/TYPE lines only, which its parser read as an
    empty counter plus an untyped series."""
    registry = CollectorRegistry()
    metrics = register(registry, StatsOnly())  # type: ignore[arg-type]
    metrics.track("ensemble", "1", batch_size=2).finish(ok=True)
    text = exposition(registry).decode()
    assert "# TYPE nv_inference_count counter\n" in text and "# HELP nv_inference_count " in text
    assert 'nv_inference_count{model="ensemble",version="1"} 2.0' in text and "nv_inference_count_total" not in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("request_success", "request_failure", "count", "exec_count", "request_duration_us",
                 "queue_duration_us", "compute_input_duration_us", "compute_infer_duration_us",
                 "compute_output_duration_us"):
        family = families["nv_inference_" + name]
        assert family.type == "counter" and len(family.samples) == 1, name
    assert all(f.type != "unknown" for f in families.values())
    assert families["nv_inference_count"].samples[0].value == 2
