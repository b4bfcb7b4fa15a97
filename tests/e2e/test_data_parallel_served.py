"""`serve --data-parallel-size 2` (the real CLI, two engine-core processes on the CPU): greedy completions equal
transformers' whichever core serves them, and a core that dies fails only its own requests: the other core's
stream finishes, /health turns 503 ("degraded"), and the server serves on with the core that is left."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

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
            if "runtime.native.core_process" in " ".join(p.cmdline())]


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
        _cores(dp_server)[1].kill()
        ends = [[line for line in lines if line] for lines in streams]
    assert all(lines[-1] == "data: [DONE]" for lines in ends)
    failed = [lines for lines in ends if "error" in json.loads(lines[-2][6:])]
    assert len(failed) == 1  # the dead core's stream; the other finished its 240 tokens
    assert "engine-core process exited unexpectedly" in json.loads(failed[0][-2][6:])["error"]["message"]
    health = httpx.get(dp_server.url + "/health")
    assert health.status_code == 503 and health.json()["status"] == "degraded"
    r = httpx.post(dp_server.url + "/v1/completions", json={**body, "stream": False, "max_tokens": 5}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5  # the core left serves
    assert dp_server.proc.poll() is None
