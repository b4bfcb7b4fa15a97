"""The engine core's message loop (runtime/native/core_process.py's CoreServer._receive) with AddRequest and Abort
for the same request read in one go, before the request's add task has run: what a Triton stop sent just after its
request does. The abort must reach the request once it is handed over. Before the fix (5b864df) the Abort found
no request, was dropped, and the request ran to its end (test_triton_grpc's early-stop test failed 1 run in 5).

The loop runs over a fake inbox that hands out the messages without waiting, and a fake engine that records what
it is asked in order; nothing else of the core is needed."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from runtime.config import EngineConfig
from runtime.native.core_process import CoreServer
from runtime.process.messages import Abort, AddRequest, Shutdown, encoder
from runtime.request import GenerationRequest, SamplingOptions


class Inbox:
    """Messages already queued: each recv returns at once, so the loop reads them all before its tasks run."""

    def __init__(self, messages: list[Any]) -> None:
        self._data = [encoder.encode(m) for m in messages]

    async def recv(self) -> bytes:
        return self._data.pop(0)


class Engine:
    """Records submit / abort calls in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.spec = SimpleNamespace(vocab_size=100)
        self.model_info = SimpleNamespace(context_window=64)
        self.config = EngineConfig(device="cpu")

    async def submit(self, request: GenerationRequest, prepared: Any) -> None:
        await asyncio.sleep(0)  # a hand-over that yields (its grammar compiling, say)
        self.calls.append(("submit", request.request_id))

    def abort(self, request_id: str, index: int | None = None) -> None:
        self.calls.append(("abort", request_id))

    async def shutdown(self, drain_timeout: float) -> None:
        pass


def _server(messages: list[Any]) -> tuple[CoreServer, Engine]:
    server = object.__new__(CoreServer)  # the loop's state alone: no sockets, no model
    engine = Engine()
    server.engine, server._inbox, server._controls = engine, Inbox(messages), [object()]  # type: ignore[assignment]
    server._owners, server._adding, server._aborted_while_adding = {}, set(), set()
    server._tasks, server._stopping = set(), False
    return server, engine


def _add(request_id: str) -> AddRequest:
    request = GenerationRequest(request_id, prompt_token_ids=[1, 2, 3], sampling=SamplingOptions(max_tokens=4))
    return AddRequest(request, [1, 2, 3], 4, [])


def test_an_abort_read_with_its_add_request_aborts_the_request_once_it_is_handed_over() -> None:
    server, engine = _server([_add("r"), Abort(["r"]), Shutdown(0.0)])
    asyncio.run(server._receive())
    assert ("submit", "r") in engine.calls
    assert engine.calls[-1] == ("abort", "r")  # after its hand-over: the engine knows it then
    assert engine.calls.index(("submit", "r")) < len(engine.calls) - 1


def test_an_abort_of_another_request_leaves_this_one_alone() -> None:
    server, engine = _server([_add("r"), Abort(["other"]), Shutdown(0.0)])
    asyncio.run(server._receive())
    assert engine.calls == [("abort", "other"), ("submit", "r")]
