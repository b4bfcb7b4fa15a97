"""--api-servers N (the real process): N front ends on one port share one engine core; SIGTERM drains them all
and leaves no process behind; a front end that dies takes the server down (non-zero), never half of it."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from tests.e2e.conftest import MODEL_NAME, free_port
from tests.e2e.test_shutdown import Served, start_together, stop_all

BODY = {"model": MODEL_NAME, "prompt": "The quick brown fox", "max_tokens": 16, "temperature": 0, "ignore_eos": True}


def tree(served: Served) -> tuple[psutil.Process, psutil.Process]:
    """(the other front end, the engine core) under the first front end."""
    children = psutil.Process(served.proc.pid).children(recursive=True)
    names = {" ".join(p.cmdline()[1:3]): p for p in children}
    assert set(names) == {"-m gateway.api_servers", "-m runtime.process.core"}, names
    return names["-m gateway.api_servers"], names["-m runtime.process.core"]


# test -> how many front ends its server has. The sharing test and the dead-front-end test use one server (the
# second ends it); the drain test its own.
FRONT_ENDS = {"test_front_ends_share_the_port_and_the_engine_core": 2,
              "test_sigterm_drains_every_front_end_and_leaves_no_process": 3,
              "test_a_dead_front_end_stops_the_server_nonzero": 2}


@pytest.fixture(scope="module")
def servers(request: pytest.FixtureRequest, tiny_model_dir: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[int], Served]]:
    """servers(n) -> the `--api-servers n` server, started again if it has exited. Those the session's tests of
    this module use are started together first (tests/e2e/test_shutdown.py: start_together)."""
    folder = tmp_path_factory.mktemp("api-servers")

    def spec(n: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return ("-m", "gateway"), ("--api-servers", str(n), "--grpc-port", str(free_port()))

    wanted = sorted({FRONT_ENDS[item.originalname] for item in request.session.items
                     if item.module is request.module and item.originalname in FRONT_ENDS})
    started = {n: served for n, served in zip(wanted, start_together(
        tiny_model_dir, folder, {f"api-servers-{n}": spec(n) for n in wanted}).values())}

    def get(n: int) -> Served:
        if n not in started or started[n].proc.poll() is not None:
            (started[n],) = start_together(tiny_model_dir, folder, {f"api-servers-{n}": spec(n)}).values()
        return started[n]

    yield get
    stop_all(started.values())


def test_front_ends_share_the_port_and_the_engine_core(servers: Callable[[int], Served]) -> None:
    """(SIGTERM with several front ends: test_sigterm_drains_every_front_end_and_leaves_no_process)"""
    served = servers(2)
    other, _ = tree(served)
    cpu_before = sum(other.cpu_times()[:2])

    def complete(i: int) -> str:
        with httpx.Client(timeout=60) as c:  # a new connection each: the kernel picks the front end
            if i % 2:  # streamed: most tokens reach the front end as id columns of the core's step messages
                with c.stream("POST", served.url + "/v1/completions", json={**BODY, "stream": True}) as r:
                    assert r.status_code == 200
                    events = [line.removeprefix("data: ") for line in r.iter_lines() if line]
                assert events[-1] == "[DONE]"
                return "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
            r = c.post(served.url + "/v1/completions", json=BODY)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

    def other_served() -> bool:  # its CPU time grows only by serving (idle, it sleeps in epoll)
        return sum(other.cpu_times()[:2]) - cpu_before > 0.05

    texts: list[str] = []
    with ThreadPoolExecutor(8) as pool:
        # the kernel hands each connection to whichever front end accepts first: rounds until the second has
        # served some (a bound on requests, not on time)
        for _ in range(10):
            texts += pool.map(complete, range(48))
            if other_served():
                break
    assert len(set(texts)) == 1  # greedy: every front end gets the same tokens from the one core, streamed or not
    assert other_served()


def test_sigterm_drains_every_front_end_and_leaves_no_process(servers: Callable[[int], Served]) -> None:
    served = servers(3)
    procs = psutil.Process(served.proc.pid).children(recursive=True)
    assert len(procs) == 3  # two more front ends and the core
    body = {**BODY, "max_tokens": 120, "stream": True}
    clients = [httpx.Client(timeout=60) for _ in range(6)]
    streams = [c.stream("POST", served.url + "/v1/completions", json=body) for c in clients]
    responses = [s.__enter__() for s in streams]
    lines = [r.iter_lines() for r in responses]
    for it in lines:
        assert next(it).startswith("data: ")
    served.proc.send_signal(signal.SIGTERM)
    for it in lines:  # every stream, whichever front end holds it, runs to its end
        rest = [line for line in it if line]
        assert rest[-1] == "data: [DONE]" and '"finish_reason":"length"' in rest[-2]
    for s in streams:
        s.__exit__(None, None, None)
    assert served.proc.wait(60) == 0
    gone, alive = psutil.wait_procs(procs, timeout=10)
    assert not alive


def test_a_dead_front_end_stops_the_server_nonzero(servers: Callable[[int], Served]) -> None:
    served = servers(2)  # the server the sharing test used, if that ran: this test ends it
    other, core = tree(served)
    other.kill()
    assert served.proc.wait(60) == 1
    assert core.wait(30) is not None or not core.is_running()
    # (the start-up line "... (front end 1 of 2)" alone met the check as it was: "front end 1" in the log)
    assert f"front end 1 (process {other.pid}) exited unexpectedly" in served.log.read_text()
