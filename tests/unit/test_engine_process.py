"""The engine core in its own process (runtime/process): same outputs as in-process, and the failure contract.

Each test starts a real core process over the tiny model; outputs are compared with NativeEngine's in this
process for the same requests (greedy, so they must be equal token for token).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from runtime import build_engine
from runtime.config import EngineConfig
from runtime.engine import Engine, EngineStats
from runtime.errors import EngineNotReadyError, InvalidRequestError
from runtime.process.client import EngineClient
from runtime.native.core_process import SocketOutbox
from runtime.process.messages import StepOutputs, to_front_end
from runtime.request import GuidedDecoding, OutputDelta
from runtime.native.request_state import RequestState
from runtime.native.step_output import StepOutput
from runtime.validation import PreparedRequest
from tests.engine_harness import Collected, collect, request, wait_for
from tests.lora_adapters import make_peft_adapter, peft_greedy
from tests.tiny_models import build_tiny_model

pytestmark = pytest.mark.long_file  # (tests/conftest.py schedules it first)

ENGINE = dict(device="cpu", dtype="float32", kv_block_size=4, max_kv_tokens=1024, max_batch_size=8)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("process"), "llama")


@asynccontextmanager
async def started(checkpoint: Path, engine_process: bool, **options: Any) -> AsyncIterator[Engine]:
    engine = build_engine(EngineConfig(model=str(checkpoint), engine_process=engine_process, **{**ENGINE, **options}))
    await engine.start()
    try:
        yield engine
    finally:
        await engine.shutdown()


def core_of(engine: Engine) -> psutil.Process:
    assert isinstance(engine, EngineClient) and engine._process is not None
    return psutil.Process(engine._process.pid)


MIXED = [  # joins at different times, a stop string, n > 1 (and in run_mixed: a grammar, a LoRA adapter, an abort)
    (0.0, request("plain", [5, 6, 7, 8], 12)),
    (0.0, request("stop", [9, 10, 11], 16, stop=["ck"], ignore_eos=False)),
    (0.01, request("n3", [12, 13], 6, n=3, temperature=0.0)),
    (0.02, request("logprobs", [14, 15, 16, 17, 18], 8, logprobs=2, prompt_logprobs=1)),
]


async def run_mixed(engine: Engine) -> dict[str, Collected]:
    guided = request("guided", [20, 21], 24, ignore_eos=False)
    guided.guided = GuidedDecoding(regex="[ab]{3}")
    adapted = request("lora", [22, 23, 24], 10)
    adapted.adapter = "ad"

    async def later(delay: float, req: Any) -> Collected:
        await asyncio.sleep(delay)
        return await collect(engine, req)

    async def aborted() -> None:  # leaves after its second delta: the core must drop it
        deltas = 0
        async for _ in engine.generate(request("aborted", [3, 4], 40)):
            deltas += 1
            if deltas == 2:
                break

    results = await asyncio.gather(*(later(d, r) for d, r in MIXED), later(0.0, guided), later(0.005, adapted),
                                   aborted())
    return dict(zip([r.request_id for _, r in MIXED] + ["guided", "lora"], results[:-1]))


def summary(out: Collected) -> tuple[Any, ...]:
    logprobs = [(lp.token_id, round(lp.logprob, 4)) for d in out.deltas for lp in d.logprobs or []]
    return out.tokens, out.text, out.finish, out.stop_reason, out.usage, logprobs


async def test_outputs_equal_in_process_and_split_and_refusals_come_back(checkpoint: Path, tmp_path: Path) -> None:
    """One core process (each costs seconds to start here): the mixed batch, then refused requests and calls, then a
    shutdown that drains a request in flight and the core's exit 0."""
    adapters = {"ad": str(make_peft_adapter(checkpoint, tmp_path / "ad", ["q_proj", "v_proj"], seed=3))}
    async with started(checkpoint, engine_process=False, lora_modules=adapters) as local:
        want = await run_mixed(local)
    split = build_engine(EngineConfig(model=str(checkpoint), engine_process=True, lora_modules=adapters, **ENGINE))
    await split.start()
    try:
        got = await run_mixed(split)
        await wait_for(lambda: split.stats().kv_blocks_used == 0 and split.stats().running == 0)
        assert {k: summary(v) for k, v in got.items()} == {k: summary(v) for k, v in want.items()}
        assert got["guided"].finish[0] == "stop" and len(got["guided"].text[0]) == 3
        # the front end matched the stop string (the core sends no text) and ended the request in the core
        assert got["stop"].stop_reason == {0: "ck"} and got["stop"].usage.completion_tokens < 16
        assert got["lora"].tokens[0] == peft_greedy(checkpoint, Path(adapters["ad"]), [22, 23, 24], 10)

        # refused in the core after the hand-over: the error keeps its class and field
        too_big = request("grammar", [1, 2], 4)
        too_big.guided = GuidedDecoding(json_schema={"enum": ["x" * 300]}, param="response_format")
        with pytest.raises(InvalidRequestError) as err:
            await collect(split, too_big)
        assert err.value.param == "response_format"
        # validated in the front end
        with pytest.raises(InvalidRequestError) as err:
            await collect(split, request("long", [1] * 5000, 4))
        assert err.value.param == "max_tokens"
        with pytest.raises(InvalidRequestError):  # a LoRA call answered by the core
            await split.load_lora_adapter("missing", str(tmp_path / "no-such-adapter"))
        assert split.lora_adapters() == adapters
        assert (await collect(split, request("after", [1, 2], 3))).finish == {0: "length"}

        # shutdown drains, then the core exits
        running = asyncio.create_task(collect(split, request("draining", [1, 2], 20)))
        await asyncio.sleep(0)  # handed over before the shutdown begins
        await split.shutdown(drain_timeout=60)
        assert (await running).finish == {0: "length"}
        assert isinstance(split, EngineClient) and split._process is not None
        assert split._process.returncode == 0
    finally:
        await split.shutdown()


@pytest.mark.parametrize("engine_process", [False, True])
async def test_a_stop_string_ends_one_sample_of_several_in_the_core(checkpoint: Path, engine_process: bool) -> None:
    """n = 2, seeded: a stop string that only sample 1's text holds cuts sample 1 there and ends it in the core (which
    then makes fewer tokens), while sample 0 comes out as without the stop string; usage counts the kept tokens."""
    async with started(checkpoint, engine_process) as engine:
        ref = await collect(engine, request("ref", [5, 6, 7], 64, n=2, temperature=1.0, seed=7))
        one, zero = ref.text[1], ref.text[0]
        at, stop = next((k, one[k : k + 3]) for k in range(2, 20) if one[k : k + 3] not in zero + one[: k + 2])
        await wait_for(lambda: engine.stats().generation_tokens_total == 128 and engine.stats().running == 0)
        out = await collect(engine, request("cut", [5, 6, 7], 64, n=2, temperature=1.0, seed=7, stop=[stop]))
        assert (out.text[0], out.finish[0], out.tokens[0]) == (zero, "length", ref.tokens[0])
        assert (out.text[1], out.finish[1], out.stop_reason[1]) == (one[:at], "stop", stop)
        assert out.tokens[1] == ref.tokens[1][: len(out.tokens[1])] and len(out.tokens[1]) < 12
        assert out.usage is not None and out.usage.completion_tokens == 64 + len(out.tokens[1])
        await wait_for(lambda: engine.stats().running == 0)
        # sample 1 ended in the core long before its 64 tokens (however many steps the abort took to arrive)
        assert engine.stats().generation_tokens_total - 128 < 64 + 32


async def test_the_core_sends_a_streams_tokens_in_groups_with_a_stream_interval(checkpoint: Path) -> None:
    async with started(checkpoint, engine_process=False) as local:
        want = await collect(local, request("grouped", [5, 6, 7], 11))
    async with started(checkpoint, engine_process=True, stream_interval=4) as split:
        assert isinstance(split, EngineClient)
        messages: list[int] = []  # tokens of the request in each step message
        dispatch = split._dispatch

        def recording_dispatch(msg: Any) -> None:
            for request_id, deltas, _ in getattr(msg, "deltas", ()):
                if request_id == "grouped":
                    messages.append(sum(len(d.token_ids) for d in deltas))
            dispatch(msg)

        split._dispatch = recording_dispatch  # type: ignore[method-assign]
        got = await collect(split, request("grouped", [5, 6, 7], 11))
    assert summary(got) == summary(want)
    assert messages == [1, 4, 4, 2]


async def test_a_streamed_plain_requests_middle_tokens_travel_as_ids_not_deltas(checkpoint: Path) -> None:
    quiet = request("quiet", [5, 6, 7], 6)
    quiet.stream = False
    requests = [request("plain", [5, 6, 7], 6), request("logprobs", [5, 6, 7], 6, logprobs=1), quiet]
    async with started(checkpoint, engine_process=False) as local:
        want = [await collect(local, r) for r in requests]
    async with started(checkpoint, engine_process=True) as split:
        assert isinstance(split, EngineClient)
        carried: dict[str, list[str]] = {}  # how each request's tokens came, in order: "id" or "delta"
        dispatch = split._dispatch

        def recording_dispatch(msg: Any) -> None:
            for request_id in getattr(msg, "token_requests", ()):
                carried.setdefault(request_id, []).append("id")
            for request_id, deltas, _ in getattr(msg, "deltas", ()):
                carried.setdefault(request_id, []).extend("delta" for d in deltas for _ in d.token_ids)
            dispatch(msg)

        split._dispatch = recording_dispatch  # type: ignore[method-assign]
        got = await asyncio.gather(*(collect(split, r) for r in requests))
    assert [summary(g) for g in got] == [summary(w) for w in want]
    # the first token brings the prompt's facts, the last the finish reason and usage
    assert carried["plain"] == ["delta"] + ["id"] * 4 + ["delta"]
    assert carried["logprobs"] == carried["quiet"] == ["delta"] * 6


def test_a_token_behind_a_delta_of_its_request_in_one_message_goes_as_a_delta() -> None:
    """Two steps' outputs may share a step output, and so a message (a step collected, then a synchronous one): the
    front end hands out the columns first, so a request's token may go there only while the message holds no delta
    of it."""
    sent: list[StepOutputs] = []

    class Socket:
        def send(self, data: bytes, flags: int = 0, copy: bool = True) -> None:
            sent.append(to_front_end.decode(data))

    outbox = SocketOutbox([Socket()], {}, EngineStats)  # type: ignore[list-item]
    a, b = (RequestState(request(r, [1, 2], 8), PreparedRequest([1, 2], 8, []), eos_token_ids=[0],
                         context_window=64, device=torch.device("cpu")) for r in ("a", "b"))
    out = StepOutput()
    out.add_token(a, 5)  # ids first, then a's delta: the front end keeps that order
    out.emit(a, [OutputDelta("a", 0, [6])])
    out.emit(b, [OutputDelta("b", 0, [7])])
    out.add_token(b, 8)
    outbox.put(out)
    out = StepOutput()
    out.add_token(b, 9)  # a new message: b has no delta there
    outbox.put(out)
    assert [(m.token_requests, m.token_ids) for m in sent] == [(["a"], [5]), (["b"], [9])]
    assert [(r, d.token_ids) for r, ds, _ in sent[0].deltas for d in ds] == [("a", [6]), ("b", [7]), ("b", [8])]


async def test_a_killed_core_fails_requests_in_flight_and_turns_not_ready(checkpoint: Path) -> None:
    async with started(checkpoint, engine_process=True) as engine:
        first = asyncio.Event()
        stream = asyncio.create_task(collect(engine, request("long", [1, 2], 200), started=first))
        await first.wait()
        core_of(engine).kill()
        out = await asyncio.wait_for(stream, 30)
        assert out.finish == {0: "error"}
        assert "engine-core process exited unexpectedly" in (out.deltas[-1].error or "")
        assert not engine.ready
        with pytest.raises(EngineNotReadyError):
            await collect(engine, request("next", [1], 2))


FRONT_END = """
import asyncio, sys
from runtime import build_engine
from runtime.config import EngineConfig
async def main():
    engine = build_engine(EngineConfig(model=sys.argv[1], device="cpu", dtype="float32", max_kv_tokens=256))
    await engine.start()
    print(engine._process.pid, flush=True)
    await asyncio.sleep(600)
asyncio.run(main())
"""


def test_the_core_exits_when_its_front_end_is_killed(checkpoint: Path, tmp_path: Path) -> None:
    script = tmp_path / "front_end.py"
    script.write_text(textwrap.dedent(FRONT_END))
    root = str(Path(__file__).resolve().parents[2])
    front = subprocess.Popen([sys.executable, str(script), str(checkpoint)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": root})
    try:
        assert front.stdout is not None
        core = psutil.Process(int(front.stdout.readline()))
        front.send_signal(signal.SIGKILL)
        front.wait(10)
        core.wait(30)  # psutil.TimeoutExpired if it stays
    finally:
        front.kill()


def test_time_is_comparable_across_processes() -> None:
    """Deadlines and delta times are time.monotonic() values taken in the other process."""
    other = float(subprocess.check_output([sys.executable, "-c", "import time; print(time.monotonic())"]))
    assert abs(other - time.monotonic()) < 5


def test_the_port_answers_while_the_core_launches(checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process's first launch starts its zygote (a Python start with torch: seconds on a busy machine); the front
    end's event loop answers /health meanwhile (it once blocked in the launch, and /health timed out)."""
    import threading

    import httpx

    import runtime.process.client as client
    from gateway.settings import Settings
    from tests.e2e.conftest import DEFAULT_ENGINE_OPTIONS, RunningServer, free_port, loading, wait_for

    gate, launching = threading.Event(), threading.Event()
    launch = client.launch

    def slow_launch(*args: Any) -> Any:
        launching.set()
        gate.wait(60)
        return launch(*args)

    monkeypatch.setattr(client, "launch", slow_launch)
    engine = EngineConfig(**{**DEFAULT_ENGINE_OPTIONS, "model": str(checkpoint), "engine_process": True})
    server = RunningServer(Settings(grpc_port=None, port=free_port(), drain_timeout=0.0, engine=engine))
    server._thread.start()
    try:
        wait_for(launching.is_set, 60, "the launch")
        health = httpx.get(server.url + "/health", timeout=2)
        assert (health.status_code, health.json()) == (503, {"status": "loading", "phase": "starting the engine core"})
        gate.set()
        wait_for(lambda: not loading(server.url), 60, "readiness")
        assert httpx.get(server.url + "/health").status_code == 200
    finally:
        gate.set()
        server.stop()
