"""`serve --tensor-parallel-size 2` (the real CLI, gloo on the CPU): greedy completions equal transformers', and a
tensor-parallel worker that dies ends every stream with an error, the server exits non-zero and no process is left."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.e2e.conftest import MODEL_NAME, reference_greedy
from tests.e2e.test_shutdown import Served, start_together, stop_all

TP_FLAGS = ("--tensor-parallel-size", "2")


@pytest.fixture(scope="module")
def tp_servers(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Served]]:
    """Two servers of the tiny model at --tensor-parallel-size 2, started together: one to ask, one to break."""
    started = start_together(tiny_model_dir, tmp_path_factory.mktemp("tp"),
                             {name: (("-m", "gateway"), TP_FLAGS) for name in ("ask", "break")})
    yield started
    stop_all(started.values())


def _worker(served: Served) -> psutil.Process:
    """The server's one tensor-parallel worker process (under its engine-core process)."""
    (worker,) = [p for p in psutil.Process(served.proc.pid).children(recursive=True)
                 if p.name() == "tp-worker-1"]
    return worker


def test_tp2_greedy_completions_match_transformers(tp_servers: dict[str, Served], hf_model) -> None:
    from transformers import AutoTokenizer

    served = tp_servers["ask"]
    tok = AutoTokenizer.from_pretrained(hf_model.name_or_path)
    assert _worker(served).is_running()
    prompts = [tok.encode("The quick brown fox"), tok.encode("tensor parallel ranks share one step")]
    body = {"model": MODEL_NAME, "prompt": prompts, "max_tokens": 10, "temperature": 0, "ignore_eos": True,
            "logprobs": 1}
    r = httpx.post(served.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    choices = sorted(r.json()["choices"], key=lambda c: c["index"])
    for prompt, choice in zip(prompts, choices, strict=True):
        want_ids, want_lps = reference_greedy(hf_model, prompt, 10)
        assert choice["text"] == tok.decode(want_ids)
        assert choice["logprobs"]["token_logprobs"] == pytest.approx(want_lps, abs=1e-4)
    assert r.json()["usage"]["completion_tokens"] == 20


def test_a_killed_tp_worker_ends_streams_with_an_error_and_the_server_exits_nonzero(
        tp_servers: dict[str, Served]) -> None:
    served = tp_servers["break"]
    processes = psutil.Process(served.proc.pid).children(recursive=True)  # the engine core and the worker
    worker = _worker(served)
    body = {"model": MODEL_NAME, "prompt": "long", "max_tokens": 240, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", served.url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        worker.kill()
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    error = json.loads(rest[-2][6:])["error"]
    assert f"tensor-parallel worker 1 (pid {worker.pid}) exited with code -9" in error["message"]
    assert served.proc.wait(30) == 1
    assert "fatal: the engine stopped serving" in served.log.read_text()
    _, alive = psutil.wait_procs(processes, timeout=10)
    assert not alive  # no process left behind
