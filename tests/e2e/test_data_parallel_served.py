"""`serve --data-parallel-size 2` (the real CLI, two engine-core processes on the CPU): greedy completions equal
transformers' whichever core serves them, and a core that dies fails only its own requests: the other core's
stream finishes, /health turns 503 ("degraded") and Triton's ready endpoints not-ready, /metrics shows which core is
down (engine_core_up{core="1"} 0) beside the other's figures, and the server serves on with the core that is left."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import MODEL_NAME, reference_greedy
from tests.e2e.test_shutdown import Served, start_together, stop_all


@pytest.fixture(scope="module")
def dp_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    started = start_together(tiny_model_dir, tmp_path_factory.mktemp("dp"),
                             {"dp": (("-m", "gateway"), ("--data-parallel-size", "2"))})
    yield started["dp"]
    stop_all(started.values())


def _cores(served: Served) -> list[psutil.Process]:
    return [p for p in psutil.Process(served.proc.pid).children(recursive=True)
            if p.name() == "engine-core"]


def _per_core(served: Served, name: str) -> dict[str, float]:
    """One trtllm_gateway_engine_core_* family from /metrics, by core label."""
    text = httpx.get(served.url + "/metrics").text
    return {sample.labels["core"]: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == "trtllm_gateway_engine_core_" + name}


def test_dp2_greedy_completions_match_transformers(dp_server: Served, hf_model) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_model.name_or_path)
    assert len(_cores(dp_server)) == 2
    prompts = [tok.encode(text) for text in ("The quick brown fox", "two cores, one port", "data parallel", "ok")]
    body = {"model": MODEL_NAME, "prompt": prompts, "max_tokens": 10, "temperature": 0, "ignore_eos": True}
    r = httpx.post(dp_server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    for prompt, choice in zip(prompts, sorted(r.json()["choices"], key=lambda c: c["index"]), strict=True):
        assert choice["text"] == tok.decode(reference_greedy(hf_model, prompt, 10)[0])
    assert r.json()["usage"]["completion_tokens"] == 40


def test_a_killed_core_fails_only_its_requests_and_health_says_degraded(dp_server: Served) -> None:
    body = {"model": MODEL_NAME, "prompt": "long", "max_tokens": 240, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", dp_server.url + "/v1/completions", json=body, timeout=60) as first, \
            httpx.stream("POST", dp_server.url + "/v1/completions", json=body, timeout=60) as second:
        streams = [first.iter_lines(), second.iter_lines()]
        assert all(next(lines).startswith("data: ") for lines in streams)  # both running: one on each core
        assert _per_core(dp_server, "up") == {"0": 1, "1": 1}
        assert all(queued > 240 for queued in _per_core(dp_server, "queued_tokens").values())  # prompt + 240 each
        _cores(dp_server)[1].kill()
        ends = [[line for line in lines if line] for lines in streams]
    assert all(lines[-1] == "data: [DONE]" for lines in ends)
    failed = [lines for lines in ends if "error" in json.loads(lines[-2][6:])]
    assert len(failed) == 1  # the dead core's stream; the other finished its 240 tokens
    assert "engine-core process exited unexpectedly" in json.loads(failed[0][-2][6:])["error"]["message"]
    health = httpx.get(dp_server.url + "/health")
    assert health.status_code == 503 and health.json()["status"] == "degraded"
    assert httpx.get(dp_server.url + "/v2/health/ready").status_code == 400  # Triton's not-ready, as /health
    up = _per_core(dp_server, "up")  # both labelled, one down (which label the killed process had: the engine's)
    assert set(up) == {"0", "1"} and sorted(up.values()) == [0, 1]
    killed, left = sorted(up, key=up.__getitem__)
    blocks = _per_core(dp_server, "kv_blocks_total")
    assert blocks[killed] == 0 < blocks[left]  # the dead core holds no KV pool any more; the other's is there
    assert _per_core(dp_server, "requests_running") == {"0": 0, "1": 0}  # the stream that finished, the dead core's
    assert _per_core(dp_server, "queued_tokens") == {"0": 0, "1": 0}
    r = httpx.post(dp_server.url + "/v1/completions", json={**body, "stream": False, "max_tokens": 5}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5  # the core left serves
    assert dp_server.proc.poll() is None
