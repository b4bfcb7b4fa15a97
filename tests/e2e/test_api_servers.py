"""--api-servers N (the real process): N front ends on one port share one engine core; SIGTERM drains them all
and leaves no process behind; a front end that dies is restarted while the others serve on (their streams run to
their end), and when the first one dies the others end their streams properly before they exit."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.e2e.conftest import MODEL_NAME, SSL_CONTEXT, free_port, wait_for
from tests.e2e.test_shutdown import Served, start_together, stop_all

BODY = {"model": MODEL_NAME, "prompt": "The quick brown fox", "max_tokens": 16, "temperature": 0, "ignore_eos": True}


def tree(served: Served) -> tuple[psutil.Process, psutil.Process]:
    """(the other front end, the engine core) under the first front end (the core under the zygote it forked from:
    runtime/process/launcher.py)."""
    children = psutil.Process(served.proc.pid).children(recursive=True)
    names = {p.name() if p.name() == "engine-core" else " ".join(p.cmdline()[1:3]): p for p in children}
    assert set(names) == {"-m gateway.api_servers", "-m runtime.native.zygote", "engine-core"}, names
    return names["-m gateway.api_servers"], names["engine-core"]


# test -> how many front ends its server has. The sharing test and the dead-front-end test use one server (the
# second ends it); the drain test its own.
FRONT_ENDS = {"test_front_ends_share_the_port_and_the_engine_core": 2,
              "test_sigterm_drains_every_front_end_and_leaves_no_process": 3,
              "test_a_dead_front_end_is_restarted_and_the_others_streams_run_to_their_end": 2,
              "test_when_the_first_front_end_dies_the_others_end_their_streams_properly": 2}


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
        with httpx.Client(timeout=60, verify=SSL_CONTEXT) as c:  # a new connection each: the kernel picks the front end
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
    assert len(procs) == 4  # two more front ends, the zygote and the core (runtime/process/launcher.py)
    body = {**BODY, "max_tokens": 120, "stream": True}
    clients = [httpx.Client(timeout=60, verify=SSL_CONTEXT) for _ in range(6)]
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


def served_by(url: str, front_ends: list[psutil.Process], stack: ExitStack, max_tokens: int = 200,
              first_token: Callable[[], None] = lambda: None) -> tuple[int, Any]:
    """A stream opened on `url` and held open in `stack`: (the pid of the front end serving it, its lines).
    `first_token` runs as soon as its first event is read."""
    client = stack.enter_context(httpx.Client(timeout=60, verify=SSL_CONTEXT))
    body = {**BODY, "max_tokens": max_tokens, "stream": True}
    response = stack.enter_context(client.stream("POST", url + "/v1/completions", json=body))
    assert response.status_code == 200
    lines = response.iter_lines()
    assert next(lines).startswith("data: ")  # in flight
    first_token()
    port = response.extensions["network_stream"].get_extra_info("socket").getsockname()[1]
    owner = next(p.pid for p in front_ends if any(c.raddr and c.raddr.port == port
                                                  for c in p.net_connections(kind="tcp")))
    return owner, lines


class Streams:
    """Streams held open on a server, each with the process of the front end that serves it."""

    def __init__(self, url: str, front_ends: list[psutil.Process]) -> None:
        self.url, self.front_ends = url, front_ends
        self.stack = ExitStack()
        self.held: list[tuple[int, Any]] = []  # (front end's pid, the stream's lines)

    def open_until_each_front_end_has_one(self, tries: int = 40) -> None:
        for _ in range(tries):
            self.held.append(served_by(self.url, self.front_ends, self.stack))
            if {p.pid for p in self.front_ends} <= {pid for pid, _ in self.held}:
                return
        raise AssertionError("the kernel never handed a connection to every front end")

    def rest(self, pid: int) -> list[list[str]]:
        """The remaining lines of each stream that front end `pid` serves."""
        return [[line for line in lines if line] for owner, lines in self.held if owner == pid]


def restarts(url: str) -> float:
    metrics = httpx.get(url + "/metrics").text
    return float(next(line.split()[-1] for line in metrics.splitlines()
                      if line.startswith("trtllm_gateway_front_end_restarts_total")))


def test_a_dead_front_end_is_restarted_and_the_others_streams_run_to_their_end(
        servers: Callable[[int], Served]) -> None:
    """Killing one front end exited the whole server after ~25 s, cutting the other front ends' streams with no
    error event and no [DONE]."""
    served = servers(2)
    other, core = tree(served)
    first = psutil.Process(served.proc.pid)
    assert restarts(served.url) == 0
    streams = Streams(served.url, [first, other])
    with streams.stack:
        streams.open_until_each_front_end_has_one()
        other.kill()
        for rest in streams.rest(first.pid):  # the surviving front end's streams end as usual
            assert rest[-1] == "data: [DONE]" and '"finish_reason":"length"' in rest[-2]
    wait_for(lambda: len(first.children()) == 2 and other.pid not in {p.pid for p in first.children()}, 60,
             "the front end to be restarted")
    (new, _) = tree(served)
    wait_for(lambda: restarts(served.url) == 1, 60, "the restart to be counted")

    def new_one_serves() -> bool:  # every request is served meanwhile; the new front end once it is up
        with ExitStack() as stack:
            owner, lines = served_by(served.url, [first, new], stack, max_tokens=4)
            assert [line for line in lines if line][-1] == "data: [DONE]"
        return owner == new.pid

    wait_for(new_one_serves, 180, "the restarted front end to serve")
    assert served.proc.poll() is None and core.is_running()


def test_when_the_first_front_end_dies_the_others_end_their_streams_properly(
        servers: Callable[[int], Served]) -> None:
    """The first front end cannot be restarted (it is the process the orchestrator runs): the others end every
    stream with an error event and the end marker, and exit non-zero with the core."""
    served = servers(2)
    other, core = tree(served)
    first = psutil.Process(served.proc.pid)
    streams = Streams(served.url, [first, other])
    with streams.stack:
        streams.open_until_each_front_end_has_one()
        # the core frozen as soon as a stream of the other front end got its first token (so that one has ~199
        # tokens to go), and while the first dies: a running core finishes the tiny model's streams in a fraction
        # of a second, before it sees its parent gone, and no stream would be failed by its death
        for _ in range(40):
            streams.held.append(served_by(served.url, [first, other], streams.stack, first_token=core.suspend))
            if streams.held[-1][0] == other.pid:
                break
            core.resume()
        first.kill()
        served.proc.wait(30)
        core.resume()
        ends = [rest[-2:] for rest in streams.rest(other.pid)]
    assert all(end[-1] == "data: [DONE]" for end in ends), ends  # each one finished, or:
    assert any('"error"' in end[0] and "engine" in end[0] for end in ends), ends  # failed by the core's death
    other.wait(60)  # (not our child: its exit code cannot be read here)
    core.wait(30)
