"""The engine core's message loop (runtime/native/core_process.py, CoreServer): the order of messages it reads.

In process, over the tiny model: the core's inbox is replaced by one that hands over a batch of messages without
yielding to the event loop between them (what zmq does when several messages are already queued), so the order
in which the core reads and handles them is fixed, not left to timing. Its outputs go out on real sockets.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from pathlib import Path

import msgspec
import pytest
import zmq
import zmq.asyncio

from runtime.config import EngineConfig
from runtime.native.core_process import Addresses, CoreServer
from runtime.process.messages import Abort, AddRequest, Shutdown, StepOutputs, encoder, to_front_end
from runtime.request import GenerationRequest, SamplingOptions
from tests.tiny_models import build_tiny_model

ENGINE = dict(device="cpu", dtype="float32", kv_block_size=4, max_kv_tokens=1024, max_batch_size=8,
              max_model_len=128)
MAX_TOKENS = 100


class BatchInbox:
    """Stands in for the core's PULL socket: `recv` returns each queued message at once (no suspension), and
    waits only when the queue is empty."""

    def __init__(self) -> None:
        self.queued: deque[bytes] = deque()

    def put(self, *messages: msgspec.Struct) -> None:
        self.queued.extend(encoder.encode(message) for message in messages)

    async def recv(self) -> bytes:
        while not self.queued:
            await asyncio.sleep(0.01)
        return self.queued.popleft()

    def close(self, linger: int = 0) -> None:
        pass


def add_request(request_id: str) -> AddRequest:
    request = GenerationRequest("", sampling=SamplingOptions(max_tokens=MAX_TOKENS, temperature=0.0,
                                                             ignore_eos=True))
    request.request_id = request_id
    return AddRequest(request, [5, 6, 7, 8], MAX_TOKENS, [])


def serve_core(checkpoint: Path, folder: Path) -> tuple[CoreServer, BatchInbox, zmq.asyncio.Socket, asyncio.Task[int]]:
    """A core serving the tiny model with a BatchInbox, the socket its outputs reach, and its serve() task (the
    caller closes the socket's context: `receiver.context.term()`)."""
    addresses = Addresses(f"ipc://{folder}/to-core", f"ipc://{folder}/to-front-end")
    receiver = zmq.asyncio.Context().socket(zmq.PULL)
    receiver.bind(addresses.to_front_end)
    server = CoreServer(EngineConfig(model=str(checkpoint), **ENGINE), [addresses])
    server._inbox.close(linger=0)
    inbox = server._inbox = BatchInbox()
    return server, inbox, receiver, asyncio.create_task(server.serve())


async def finish_reasons(checkpoint: Path, folder: Path, batch: list[msgspec.Struct],
                         request_id: str) -> tuple[list[str], int]:
    """Serve a core, hand it `batch` in one go; the finish reasons and token count of `request_id`."""
    server, inbox, receiver, serving = serve_core(checkpoint, folder)
    reasons: list[str] = []
    tokens = 0
    try:
        inbox.put(*batch)
        while True:
            msg = to_front_end.decode(await asyncio.wait_for(receiver.recv(), 120.0))
            if not isinstance(msg, StepOutputs):
                continue
            tokens += msg.token_requests.count(request_id)
            for rid, deltas, final in msg.deltas:
                if rid == request_id:
                    tokens += sum(len(delta.token_ids) for delta in deltas)
                    reasons += [delta.finish_reason for delta in deltas if delta.finish_reason is not None]
                    if final:
                        return reasons, tokens
    finally:
        inbox.put(Shutdown(drain_timeout=0.0))
        assert await asyncio.wait_for(serving, 60.0) == 0
        server.close()
        receiver.close(linger=0)
        receiver.context.term()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("core-messages"), "llama")


def test_an_abort_read_in_the_same_batch_as_its_request_aborts_it(checkpoint: Path, tmp_path: Path) -> None:
    """A Triton stop sent right after its request: both reach the core together. Before the fix the Abort was
    handled before the request's add task ran, found no such request and was dropped: the request ran to its
    full length (test_triton_grpc's early-stop test failed 1 run in 5)."""
    reasons, tokens = asyncio.run(finish_reasons(checkpoint, tmp_path, [add_request("r"), Abort(["r"])], "r"))
    assert reasons == ["abort"] and tokens < MAX_TOKENS


def test_a_request_without_an_abort_runs_to_its_length(checkpoint: Path, tmp_path: Path) -> None:
    """The same harness without the Abort: the request runs to max_tokens (so the test above can fail)."""
    assert asyncio.run(finish_reasons(checkpoint, tmp_path, [add_request("r")], "r")) == (["length"], MAX_TOKENS)


def test_a_dying_step_loop_hands_every_error_over_before_the_core_exits(checkpoint: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor-parallel worker dies mid-request: the core must send the request's error (naming the worker) before
    it exits. Before the fix the core exited as soon as the engine turned not ready, while the step loop was still
    failing its requests: the front end saw only 'the engine-core process exited' (CI, 2026-11-29). Failing the
    requests is slowed here so that the old order loses every time."""
    from runtime.native.engine_core import EngineCore
    fail_all = EngineCore.fail_all

    def slow_fail_all(self: EngineCore, *args: object) -> object:
        time.sleep(0.5)
        return fail_all(self, *args)

    monkeypatch.setattr(EngineCore, "fail_all", slow_fail_all)
    reason = "tensor-parallel worker 1 (pid 1) exited with code -9"

    async def serve_until_the_core_exits() -> tuple[int, list[str]]:
        server, inbox, receiver, serving = serve_core(checkpoint, tmp_path)
        errors: list[str] = []
        try:
            inbox.put(add_request("r"))
            while not isinstance(msg := to_front_end.decode(await asyncio.wait_for(receiver.recv(), 120.0)),
                                 StepOutputs) or "r" not in msg.token_requests:
                pass  # until the request runs
            server.engine._worker_died(reason)
            code = await asyncio.wait_for(serving, 60.0)
            server.close()
            while await receiver.poll(1000):
                msg = to_front_end.decode(await receiver.recv())
                if isinstance(msg, StepOutputs):
                    errors += [delta.error for _, deltas, _ in msg.deltas for delta in deltas if delta.error]
            return code, errors
        finally:
            receiver.close(linger=0)
            receiver.context.term()

    code, errors = asyncio.run(serve_until_the_core_exits())
    assert code == 1
    assert len(errors) == 1 and reason in errors[0]
