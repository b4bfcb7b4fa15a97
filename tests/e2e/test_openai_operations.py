"""Operations through the real server: readiness while loading, Prometheus metrics, request ids, prompt logging."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from gateway.settings import Settings
from runtime.config import EngineConfig
from tests.e2e.conftest import DEFAULT_ENGINE_OPTIONS, MODEL_NAME, RunningServer, free_port, loading, scrape, wait_for


def test_health_is_503_while_loading_then_200(tiny_model_dir: Path) -> None:
    settings = Settings(grpc_port=None, port=free_port(), drain_timeout=0.0,
                        engine=EngineConfig(**{**DEFAULT_ENGINE_OPTIONS, "model": str(tiny_model_dir),
                                               "engine_process": False}))  # its load() is held below
    srv = RunningServer(settings)
    # Hold the real engine's model loading until the test has seen the server answer meanwhile.
    gate = threading.Event()
    load = srv.engine.load
    srv.engine.load = lambda: (gate.wait(60), load())[1]  # type: ignore[method-assign]
    srv._thread.start()
    try:
        wait_for(lambda: loading(srv.url), 30, "the server to listen")
        assert httpx.get(srv.url + "/health").json() == {"status": "loading"}
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "service_unavailable"
        gate.set()
        wait_for(lambda: httpx.get(srv.url + "/health").status_code == 200, 60, "readiness")
        assert httpx.get(srv.url + "/health").json() == {"status": "ready"}
    finally:
        gate.set()
        srv.stop()


FAMILIES = [
    "trtllm_gateway_requests_total", "trtllm_gateway_time_to_first_token_seconds_bucket",
    "trtllm_gateway_inter_token_latency_seconds_bucket", "trtllm_gateway_e2e_request_latency_seconds_bucket",
    "trtllm_gateway_prompt_tokens_total", "trtllm_gateway_generation_tokens_total",
    "trtllm_gateway_requests_running", "trtllm_gateway_requests_waiting", "trtllm_gateway_kv_blocks_used",
    "trtllm_gateway_kv_blocks_free",
]


def test_metrics_count_requests_tokens_and_latencies(server: RunningServer, client: openai.OpenAI) -> None:
    before = scrape(server.url)
    out = client.completions.create(model=MODEL_NAME, prompt="the cat", max_tokens=5, temperature=0,
                                    extra_body={"ignore_eos": True})
    httpx.post(server.base_url + "/completions", json={"model": "nope", "prompt": "x"})
    after = scrape(server.url)
    names = {name.split("{")[0] for name in after}
    assert set(FAMILIES) <= names

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert delta("trtllm_gateway_requests_total{endpoint=/v1/completions,status=200}") == 1
    assert delta("trtllm_gateway_requests_total{endpoint=/v1/completions,status=404}") == 1
    assert delta("trtllm_gateway_prompt_tokens_total") == out.usage.prompt_tokens
    assert delta("trtllm_gateway_generation_tokens_total") == 5
    assert delta("trtllm_gateway_time_to_first_token_seconds_count") == 1
    assert delta("trtllm_gateway_e2e_request_latency_seconds_count") == 1
    assert delta("trtllm_gateway_inter_token_latency_seconds_count") >= 1
    if server.settings.engine.backend == "native":  # TensorRT-LLM reports KV usage per iteration only
        total = after["trtllm_gateway_kv_blocks_total"]
        assert after["trtllm_gateway_kv_blocks_free"] + after["trtllm_gateway_kv_blocks_used"] == total > 0


def test_request_id_is_echoed_or_assigned(http: httpx.Client) -> None:
    r = http.get("/v1/models", headers={"x-request-id": "client-chosen-id"})
    assert r.headers["x-request-id"] == "client-chosen-id"
    a, b = http.get("/v1/models").headers["x-request-id"], http.get("/v1/models").headers["x-request-id"]
    assert a and b and a != b


def _completion_with_marker(url: str, marker: str) -> None:
    r = httpx.post(url + "/v1/completions", json={"model": MODEL_NAME, "prompt": marker, "max_tokens": 1},
                   headers={"x-request-id": "logged-req"}, timeout=60)
    assert r.status_code == 200


def test_prompts_are_not_logged_by_default(server: RunningServer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        _completion_with_marker(server.url, "secret-marker-1234")
        time.sleep(0.05)
    assert any(rec.name == "gateway.access" and "POST /v1/completions 200" in rec.getMessage()
               for rec in caplog.records)  # logging was captured
    assert "secret-marker-1234" not in caplog.text


def test_log_prompts_logs_them_with_the_request_id(start_server, caplog: pytest.LogCaptureFixture) -> None:
    srv = start_server("native", gateway={"log_prompts": True})
    with caplog.at_level(logging.INFO, logger="gateway.openai"):
        _completion_with_marker(srv.url, "visible-marker-5678")
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "gateway.openai"]
    assert any("logged-req" in line and "visible-marker-5678" in line for line in lines)
