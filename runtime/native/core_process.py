"""The engine-core process: a NativeEngine driven by messages from the front end (runtime/process/client.py), which
launches it (`run`, runtime/process/launcher.py: a process named `engine-core`).

The front end has already tokenized and validated each request; here it is checked again (a message is decoded,
not trusted) and handed to the step thread (after its grammar compiles, when it has one). Nothing in one message
ends the core: one it cannot decode, check or compile is refused alone (`Rejected`, an InvalidRequestError naming
the field, for its front end to answer in its dialect), and one that names no request or front end is dropped.
The step thread sends each step's deltas itself (SocketOutbox), so per step there is one message and no hop
through this process's event loop. This loop sends the rest on its own socket: Ready/StartFailed, refusals and
LoRA replies.

Signals: SIGINT and SIGTERM are ignored. The front end drains first and then sends Shutdown; Ctrl-C or a
group-wide SIGTERM reaches both processes, and the core must keep serving while the front end drains. If the
front end dies anyway, the kernel kills the core with it (Linux; elsewhere it notices within PARENT_POLL s:
runtime/process/parent.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable

import msgspec
import zmq
import zmq.asyncio

from runtime.config import EngineConfig
from runtime.engine import EngineStats
from runtime.errors import brief
from runtime.native.llm_engine import NativeEngine
from runtime.native.outbox import Outbox, Pending
from runtime.process.messages import (
    STATS_PERIOD,
    Abort,
    AddRequest,
    Addresses,
    Attach,
    CoreArgs,
    ErrorInfo,
    LoraCall,
    LoraReply,
    Phase,
    Ready,
    Rejected,
    Shutdown,
    StartFailed,
    StepOutputs,
    encoder,
    error_info,
    to_core,
)
from runtime.process.parent import exit_when_orphaned
from runtime.native.request_state import RequestState
from runtime.validation import PreparedRequest, check_prepared

logger = logging.getLogger(__name__)

LINGER_MS = 5000  # how long the last messages may take to leave when the core exits


class SocketOutbox(Outbox):
    """Sends each step's outputs in one message per front end (to the one that sent each request), with the
    engine's stats at most every STATS_PERIOD s (and whenever a request ends, so the front ends' view is exact
    when idle). A streamed request's plain tokens (StepOutput's columns) travel as two columns of the message
    (request ids, token ids): no delta is built, encoded and decoded per token. The front end hands out a
    message's columns before its deltas, as StepOutput orders them."""

    def __init__(self, sockets: list[zmq.Socket], owners: dict[str, int], stats: Callable[[], EngineStats],
                 stream_interval: int = 1) -> None:
        super().__init__(stream_interval)
        self._sockets = sockets
        self._owners = owners  # request id -> front end; filled by the receiving loop before submit
        self._stats = stats
        self._stats_sent = 0.0
        self._token_requests: list[str] = []  # the columns of the next message
        self._token_ids: list[int] = []

    def add_token(self, state: RequestState, token_id: int) -> None:
        if not (state.request.stream and self.stream_interval == 1):  # held back: as a delta
            super().add_token(state, token_id)
            return
        self._token_requests.append(state.request_id)
        self._token_ids.append(token_id)

    def send(self, pending: Pending) -> None:
        requests, token_ids = self._token_requests, self._token_ids
        self._token_requests, self._token_ids = [], []
        now = time.monotonic()
        stats = None
        if now - self._stats_sent >= STATS_PERIOD or any(final for _, _, final in pending):
            stats, self._stats_sent = self._stats(), now
        columns = {0: (requests, token_ids)}
        if len(self._sockets) > 1:  # (before a final delta below lets go of its request's owner)
            columns = {}
            for request_id, token_id in zip(requests, token_ids):
                owned = columns.setdefault(self._owners.get(request_id, 0), ([], []))
                owned[0].append(request_id)
                owned[1].append(token_id)
        by_front_end: dict[int, list[tuple[str, list, bool]]] = {}
        for state, ds, final in pending:
            owner = self._owners.pop(state.request_id, 0) if final else self._owners.get(state.request_id, 0)
            by_front_end.setdefault(owner, []).append((state.request_id, ds, final))
        for index, socket in enumerate(self._sockets):
            deltas = by_front_end.get(index, [])
            owned_requests, owned_ids = columns.get(index, ([], []))
            if deltas or owned_requests or stats is not None:
                message = StepOutputs(deltas, stats, owned_requests, owned_ids, now)
                try:
                    socket.send(encoder.encode(message), zmq.NOBLOCK, copy=False)
                except zmq.Again:  # a dead front end's queue is full: never block the step thread for it
                    pass


class CoreServer:
    """Receives the front end's messages and drives the engine; sends its control replies."""

    def __init__(self, config: EngineConfig, addresses: list[Addresses]) -> None:
        self._context = zmq.asyncio.Context()
        self._inbox = self._context.socket(zmq.PULL)  # fair-queued from every front end
        for pair in addresses:
            self._inbox.connect(pair.to_core)
        self._controls = [self._push(self._context, pair) for pair in addresses]
        # the step thread's own sockets (a zmq socket belongs to one thread)
        self._step_context = zmq.Context()
        self._outputs = [self._push(self._step_context, pair) for pair in addresses]
        self._owners: dict[str, int] = {}
        self.engine = NativeEngine(config, outbox=SocketOutbox(self._outputs, self._owners,
                                                               lambda: self.engine.stats(), config.stream_interval))
        self._adding: set[str] = set()  # requests whose grammar is compiling
        self._aborted_while_adding: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False

    @staticmethod
    def _push(context: zmq.Context, pair: Addresses) -> zmq.Socket:
        socket = context.socket(zmq.PUSH)
        socket.connect(pair.to_front_end)
        return socket

    async def _tell_all(self, msg: object) -> None:
        data = encoder.encode(msg)
        for index in range(len(self._controls)):
            await self._tell(index, data)

    async def _tell(self, front_end: int, data: bytes) -> None:
        """Send to one front end; dropped when its queue is full (a dead front end's, until it is restarted)."""
        try:
            await self._controls[front_end].send(data, zmq.NOBLOCK)
        except zmq.Again:
            logger.warning("front end %d is not reading; a message to it was dropped", front_end)

    def _ready(self) -> Ready:
        info = self.engine.model_info
        return Ready(self.engine.lora_adapters() or {}, self.engine.stats(), os.getpid(), self.engine.phase,
                     info.dtype, info.device, info.max_num_tokens)

    async def serve(self) -> int:
        """Start the engine, then serve until Shutdown (0) or the engine dies (1)."""
        phases = asyncio.create_task(self._report_phases())
        try:
            await self.engine.start()
        except Exception as exc:
            logger.exception("engine failed to start")
            await self._tell_all(StartFailed(f"{type(exc).__name__}: {exc}"))
            phases.cancel()
            return 1
        await self._tell_all(self._ready())
        watcher = asyncio.create_task(self._watch_engine())
        receiver = asyncio.create_task(self._receive())
        done, _ = await asyncio.wait({watcher, receiver}, return_when=asyncio.FIRST_COMPLETED)
        watcher.cancel()
        receiver.cancel()
        phases.cancel()
        if receiver in done:
            receiver.result()  # a broken message loop fails loudly
            return 0
        return 1

    async def _report_phases(self, poll: float = 0.1) -> None:
        """Tell the front ends each change of the engine's start-up phase (their /health shows it)."""
        told: str | None = None
        while True:
            phase = self.engine.phase
            if phase != told:
                await self._tell_all(Phase(phase))
                told = phase
            await asyncio.sleep(poll)

    async def _receive(self) -> None:
        while True:
            data = await self._inbox.recv()
            try:
                msg = to_core.decode(data)
            except Exception as exc:  # noqa: BLE001 - wrong types, shapes or extensions: refused, never fatal
                await self._refuse_malformed(data, exc)
                continue
            if isinstance(msg, AddRequest):
                # marked before its task runs: an Abort read right after it (a Triton stop sent just after its
                # request) otherwise found no request and was dropped, and the request ran to its end
                self._adding.add(msg.request.request_id)
                self._spawn(self._add(msg))
            elif isinstance(msg, Abort):
                for request_id in msg.request_ids:
                    if request_id in self._adding and msg.index is None:
                        self._aborted_while_adding.add(request_id)
                    self.engine.abort(request_id, msg.index)
            elif isinstance(msg, LoraCall):
                self._spawn(self._lora(msg))
            elif isinstance(msg, Attach):
                self._attach(msg.front_end)
            elif isinstance(msg, Shutdown):
                self._stopping = True
                # requests handed over before the shutdown are served (a failed hand-over was answered already)
                await asyncio.gather(*self._tasks, return_exceptions=True)
                await self.engine.shutdown(msg.drain_timeout)
                return

    def _attach(self, front_end: int) -> None:
        """A front end (re)starts: abort what its earlier process left running, and say Ready to it."""
        if not 0 <= front_end < len(self._controls):
            return
        left = [request_id for request_id, owner in list(self._owners.items()) if owner == front_end]
        for request_id in left:
            if request_id in self._adding:
                self._aborted_while_adding.add(request_id)
            self.engine.abort(request_id)
        if left:
            logger.warning("front end %d restarted: aborted the %d requests its earlier process left", front_end,
                           len(left))
        self._spawn(self._tell(front_end, encoder.encode(self._ready())))

    def _spawn(self, coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _refuse_malformed(self, data: bytes, exc: Exception) -> None:
        """Refuse a message that does not decode as what it claims to be, to the request and front end it names."""
        addressee = _addressee(data, len(self._controls))
        if addressee is None:
            logger.error("dropped a message that names no request of a front end: %s", brief(exc))
            return
        request_id, front_end = addressee
        match = _FIELD_PATH.search(str(exc))
        names = re.findall(r"\.(\w+)", match[1]) if match else []
        param = names[-1] if names else None
        reason = _FIELD_PATH.sub("", str(exc)) if match else f"{type(exc).__name__}: {exc}"
        error = ErrorInfo("InvalidRequestError", brief(f"Invalid value for '{param or 'the request'}': {reason}"),
                          {"param": param})
        await self._tell(front_end, encoder.encode(Rejected(request_id, error)))

    async def _add(self, msg: AddRequest) -> None:
        request_id = msg.request.request_id
        if not 0 <= msg.front_end < len(self._controls):
            logger.error("dropped request %s of an unknown front end %d", brief(request_id), msg.front_end)
            self._adding.discard(request_id)
            self._aborted_while_adding.discard(request_id)
            return
        self._owners[request_id] = msg.front_end
        try:
            prepared = PreparedRequest(msg.prompt_token_ids, msg.max_tokens, msg.bad_words_ids)
            engine = self.engine
            check_prepared(msg.request, prepared, vocab_size=engine.spec.vocab_size,
                           context_window=engine.model_info.context_window, config=engine.config,
                           max_num_tokens=engine.model_info.max_num_tokens)
            await engine.submit(msg.request, prepared)
        except Exception as exc:  # noqa: BLE001 - every refusal goes back to its caller
            self._owners.pop(request_id, None)
            self._aborted_while_adding.discard(request_id)
            await self._tell(msg.front_end, encoder.encode(Rejected(request_id, error_info(exc))))
            return
        finally:
            self._adding.discard(request_id)
        if request_id in self._aborted_while_adding:  # aborted before its hand-over (its grammar compiling, say)
            self._aborted_while_adding.discard(request_id)
            self.engine.abort(request_id)

    async def _lora(self, msg: LoraCall) -> None:
        error = None
        try:
            if msg.path is None:
                await self.engine.unload_lora_adapter(msg.name)
            else:
                await self.engine.load_lora_adapter(msg.name, msg.path)
        except Exception as exc:  # noqa: BLE001
            error = error_info(exc)
        await self._tell_all(LoraReply(msg.call_id, self.engine.lora_adapters() or {}, error, msg.front_end))

    async def _watch_engine(self) -> None:
        """Return when the engine's step loop died without having been told to stop, once it has handed every
        request's error over (waiting for `ready` alone raced it: the process could exit first)."""
        while self._stopping or self.engine.loop_alive:
            await asyncio.sleep(0.1)
        logger.error("the engine's step loop died; the engine-core process exits")

    def close(self) -> None:
        for socket in self._outputs + self._controls:
            socket.close(linger=LINGER_MS)
        self._inbox.close(linger=0)
        self._step_context.term()
        self._context.term()


_FIELD_PATH = re.compile(r" - at `\$((?:\.\w+|\[\d+\])*)[^`]*`")  # where msgspec says the bad value is
def _addressee(data: bytes, front_ends: int) -> tuple[str, int] | None:
    """(request id, front end) of a malformed AddRequest, read leniently; None when it names neither."""
    try:
        raw = msgspec.msgpack.decode(data)  # plain values: extensions stay msgspec.msgpack.Ext
    except Exception:  # noqa: BLE001 - not even msgpack
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("request"), dict):
        return None
    request_id, front_end = raw["request"].get("request_id"), raw.get("front_end", 0)
    if not isinstance(request_id, str) or type(front_end) is not int or not 0 <= front_end < front_ends:
        return None
    return request_id, front_end


def run(encoded_args: bytes) -> int:
    """Entry point of the engine-core process (see the module docstring), launched by the front end
    (runtime/process/launcher.py) with its CoreArgs; non-zero on failure."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    args = msgspec.msgpack.decode(encoded_args, type=CoreArgs)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s engine-core %(name)s: %(message)s")
    exit_when_orphaned(args.parent_pid)
    server = CoreServer(args.config, args.addresses)
    try:
        return asyncio.run(server.serve())
    finally:
        server.close()
