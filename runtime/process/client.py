"""EngineClient: the native engine run in its own process, seen from the front end as an Engine.

    engine = EngineClient(config)      # what runtime.build_engine returns for backend "native"
    await engine.start()               # launches the engine-core process (runtime/native/core_process.py)

Split (vLLM v1's): this process keeps HTTP, tokenization, chat templates, validation and the text of the outputs
(runtime/async_engine.py, runtime/output_processor.py); the core process keeps the scheduler, KV blocks, model,
sampler, LoRA and speculation, with a GIL of its own. They talk over two ZeroMQ ipc:// sockets with msgpack
messages (runtime/process/messages.py): requests and aborts in, one message per engine step out. A receiver task
puts each step's token-level deltas into the per-request queues that `generate_batches` reads, as the in-process
engine does.

Failure contract: the core's exit is seen at once (a pidfd of it is watched by the event loop). Every
request in flight then ends with an error delta, `ready` turns False (the gateway's watcher makes /health 503
and the server exit non-zero). `shutdown` drains in the core, then waits for it to exit, killing it if needed.

Several front ends (--api-servers N, gateway/api_servers.py) share one core: front end 0 starts it with a
socket pair for each, the others attach to theirs (`FrontEnd`: an Attach message, answered by Ready, which
also ends what an earlier process of the same front end left running: a restarted front end attaches the same
way), learn the core's pid from its Ready message and leave its shutdown to front end 0.
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import itertools
import logging
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from runtime.async_engine import AsyncEngine
from runtime.config import EngineConfig
from runtime.default_model import gguf_to_convert
from runtime.delivery import END, Mailbox
from runtime.engine import EngineStats, ModelInfo
from runtime.errors import EngineFailedError, EngineNotReadyError, InvalidRequestError
from runtime.output_processor import OutputProcessor
from runtime.process.launcher import Child, launch
from runtime.process.messages import (
    Abort,
    AddRequest,
    Addresses,
    Attach,
    CoreArgs,
    LoraCall,
    LoraReply,
    Phase,
    Ready,
    Rejected,
    Shutdown,
    StartFailed,
    StepOutputs,
    ToCore,
    encoder,
    rebuild_error,
    to_front_end,
)
from runtime.request import GenerationRequest, OutputDelta
from runtime.served_model import builds_cpu_kernels, convert_apart, describe_served_model
from runtime.tokenizer import Tokenizer
from runtime.validation import PreparedRequest
from runtime.workers import WorkerPool

logger = logging.getLogger(__name__)

EXIT_GRACE = 30.0  # s the core may take to exit after draining, before it is killed


@dataclass(frozen=True)
class FrontEnd:
    """This front end's place among those sharing one core: index (0 starts the core), count, and the folder
    of their sockets."""

    index: int = 0
    count: int = 1
    folder: str | None = None  # None (one front end): a fresh temporary folder

    def addresses(self, folder: str, index: int | None = None) -> Addresses:
        i = self.index if index is None else index
        return Addresses(f"ipc://{folder}/to-core-{i}", f"ipc://{folder}/to-front-end-{i}")


class EngineClient(AsyncEngine):
    """The front end's handle on the engine-core process (see the module docstring)."""

    def __init__(self, config: EngineConfig, front_end: FrontEnd = FrontEnd()) -> None:
        self.config = config
        self.front_end = front_end
        # a GGUF file to convert first (tens of seconds) is converted in start(), while the port is open (with several
        # front ends, before they start: each would convert it)
        self._converting = gguf_to_convert(config.model, config.dtype) if front_end.count == 1 else None
        if self._converting is None:
            self._describe()
        else:  # what the gateway needs before start(); requests wait for readiness
            self.model_info = ModelInfo(config.served_model_name or self._converting, 0, 0, "native")
        self._phase: str | None = None
        self._stats = EngineStats(max_batch_size=config.max_batch_size, max_num_tokens=config.max_num_tokens or 0)
        self._adapters: dict[str, str] | None = None  # the core's, once it is ready
        self._queues: dict[str, tuple[Mailbox, int]] = {}  # request id -> (its deltas, samples)
        self._lora_calls: dict[int, asyncio.Future[None]] = {}
        self._call_ids = itertools.count()
        self._process: Child | None = None  # front end 0's child
        self._started = False
        self._exit_fd: int | None = None
        self._folder: str | None = None
        self._sender: zmq.Socket | None = None
        self._receiver: zmq.asyncio.Socket | None = None
        self._receiving: asyncio.Task[None] | None = None
        self._accepting = False
        self._stopping = False
        self._failure: str | None = None
        self._prepare = WorkerPool("prepare")  # tokenizing large prompts and bad words, off the event loop

    def _describe(self) -> None:
        """The served model, from its config.json (a GGUF file converted first, in a child process: no torch here)."""
        convert_apart(self.config)
        model = describe_served_model(self.config)
        self.model_path, self.model_info = model.path, model.info

    @property
    def phase(self) -> str | None:
        return self._phase

    # ---- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        if self._converting is not None:
            self._phase = ("converting the GGUF file into a checkpoint (once: it is cached for the next starts)"
                           if not builds_cpu_kernels(self.config) else "converting the GGUF file into a checkpoint "
                           "and building the CPU kernels (once: both are cached for the next starts)")
            started = time.perf_counter()
            await asyncio.to_thread(self._describe)
            logger.info("start-up: %s: %.1f s", self._phase, time.perf_counter() - started)
        self._phase = "starting the engine core"
        front_end = self.front_end
        self._folder = front_end.folder or tempfile.mkdtemp(prefix="trtllm-gateway-")
        addresses = front_end.addresses(self._folder)
        self._sender = zmq.Context.instance().socket(zmq.PUSH)
        self._sender.setsockopt(zmq.SNDHWM, 0)  # never drop or block: the core's death is watched instead
        self._sender.bind(addresses.to_core)
        self._receiver = zmq.asyncio.Context.instance().socket(zmq.PULL)
        self._receiver.setsockopt(zmq.RCVHWM, 0)
        self._receiver.bind(addresses.to_front_end)
        try:
            if front_end.index == 0:
                await self._spawn_core([front_end.addresses(self._folder, i) for i in range(front_end.count)])
            # the tokenizer (and its detokenizing table: text is made here) loads while the core starts
            self.outputs = await asyncio.to_thread(_output_processor, self.config.tokenizer or self.model_path)
            self.tokenizer = self.outputs.tokenizer
            ready = await self._first_message()
            if self._process is None:  # attached: watch the core that front end 0 started
                self._watch_core(ready.pid)
        except BaseException:
            self._stopping = True
            self._kill()
            self._close()
            raise
        self._adapters, self._stats, self._phase = ready.adapters, ready.stats, ready.phase
        self.model_info.dtype, self.model_info.device = ready.dtype, ready.device
        self.model_info.max_num_tokens = ready.max_num_tokens
        self._receiving = asyncio.create_task(self._receive())
        self._accepting = True
        logger.info("engine core running in process %d (front end %d of %d)", ready.pid, front_end.index + 1,
                    front_end.count)

    async def _spawn_core(self, addresses: list[Addresses]) -> None:
        args = CoreArgs(self.config, addresses, os.getpid(), logging.getLogger().getEffectiveLevel())
        # in a thread: a process's first launch starts its zygote (a Python start with torch: seconds on a busy
        # machine), and meanwhile this event loop answers /health ("starting the engine core")
        self._process = await asyncio.to_thread(launch, "engine-core", "runtime.native.core_process:run",
                                                msgspec.msgpack.encode(args))
        atexit.register(self._kill)  # a front end that exits without shutdown() leaves no core behind
        self._watch_core(self._process.pid)

    def _watch_core(self, pid: int) -> None:
        self._exit_fd = os.pidfd_open(pid)  # readable once the core has exited
        asyncio.get_running_loop().add_reader(self._exit_fd, self._on_core_exit)

    async def _first_message(self) -> Ready:
        assert self._receiver is not None
        attached = self._process is not None  # front end 0 started the core: it says Ready unasked
        while True:
            if not attached:  # (until the core has connected, there is no one to send it to)
                try:
                    self._send(Attach(self.front_end.index))
                    attached = True
                except zmq.Again:
                    pass
            if await self._receiver.poll(200):
                msg = to_front_end.decode(await self._receiver.recv())
                if isinstance(msg, StartFailed):
                    raise EngineFailedError(f"the engine core failed to start: {msg.error}")
                if isinstance(msg, Ready):
                    return msg
                if isinstance(msg, Phase):
                    self._phase = msg.text
                # Ready and step outputs leave the core on different sockets: a front end that starts while others
                # already serve may see their steps' stats first, and a restarted one what its earlier process was
                # sent (none of that is about its own requests)
                continue
            if self._failure is not None:
                raise EngineFailedError(self._failure)

    async def shutdown(self, drain_timeout: float = 0.0) -> None:
        self._accepting = False
        process = self._process
        if not self._started or self._stopping:
            return
        self._stopping = True
        if process is None:  # attached: front end 0 shuts the core down
            self._fail_in_flight("EngineNotReadyError: the engine shut down")
            self._close()
            return
        if process.poll() is None:
            try:
                self._send(Shutdown(drain_timeout))
                await asyncio.to_thread(process.wait, drain_timeout + EXIT_GRACE)
            except (zmq.Again, subprocess.TimeoutExpired):  # not connected yet (a start cut short), or too slow
                pass  # killed below
        self._kill()
        await self._drain_messages()  # the core's last deltas (aborts of what did not finish in time)
        self._fail_in_flight("EngineNotReadyError: the engine shut down")
        self._close()

    def _kill(self) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            logger.warning("killing the engine-core process %d", process.pid)
            process.kill()
            process.wait(5)

    def _close(self) -> None:
        atexit.unregister(self._kill)  # the core is gone; the hook would keep this object alive
        if self._exit_fd is not None:
            asyncio.get_running_loop().remove_reader(self._exit_fd)
            os.close(self._exit_fd)
            self._exit_fd = None
        if self._receiving is not None:
            self._receiving.cancel()
        for socket in (self._sender, self._receiver):
            if socket is not None:
                socket.close(linger=0)
        if self._folder is not None and self.front_end.index == 0:  # the others' sockets are gone by now
            shutil.rmtree(self._folder, ignore_errors=True)
        self._prepare.shutdown()

    @property
    def ready(self) -> bool:
        return self._accepting and self._failure is None

    def _on_core_exit(self) -> None:
        assert self._exit_fd is not None
        asyncio.get_running_loop().remove_reader(self._exit_fd)
        if self._stopping:
            return
        code = self._process.wait() if self._process is not None else "unknown: another front end started it"
        self._failure = f"the engine-core process exited unexpectedly (exit code {code})"
        logger.error("%s; failing the requests in flight", self._failure)
        self._fail_in_flight(f"EngineFailedError: {self._failure}")
        for future in self._lora_calls.values():
            if not future.done():
                future.set_exception(EngineFailedError(self._failure))

    def _fail_in_flight(self, error: str) -> None:
        queues, self._queues = self._queues, {}
        for request_id, (queue, samples) in queues.items():
            for index in range(samples):
                queue.put_nowait(OutputDelta(request_id=request_id, index=index, finish_reason="error", error=error))
            queue.put_nowait(END)

    # ---- messages -----------------------------------------------------------------------------
    def _send(self, msg: ToCore | bytes) -> None:
        assert self._sender is not None
        self._sender.send(msg if isinstance(msg, bytes) else encoder.encode(msg), zmq.NOBLOCK, copy=False)

    async def _receive(self) -> None:
        assert self._receiver is not None
        while True:
            # A step's outputs are handed out in one go. Handing them out in slices of 32 with a yield between
            # (tried 2026-11-26) cut the event-loop lag p99 from 1.3 to 1.06 ms but cost a single front end
            # 30-40% of its throughput at 256 streams (H200; benchmarks/RESULTS.md).
            self._dispatch(to_front_end.decode(await self._receiver.recv()))

    async def _drain_messages(self) -> None:
        """Dispatch what the core sent before it exited (after `_receive` stopped or never ran)."""
        assert self._receiver is not None
        if self._receiving is not None:
            self._receiving.cancel()
            self._receiving = None
        while await self._receiver.poll(0):
            self._dispatch(to_front_end.decode(await self._receiver.recv()))

    def _deliver(self, outputs: list[tuple[str, list[OutputDelta], bool]]) -> None:
        """Each request's new deltas into its queue (an END after its last)."""
        for request_id, deltas, final in outputs:
            entry = self._queues.get(request_id)
            if entry is None:  # its caller is gone (aborted)
                continue
            queue = entry[0]
            for delta in deltas:
                queue.put_nowait(delta)
            if final:
                queue.put_nowait(END)
                del self._queues[request_id]

    def _deliver_tokens(self, request_ids: list[str], token_ids: list[int], produced: float) -> None:
        """One more token of each of these requests (a step message's columns), as a delta into its queue."""
        queues = self._queues
        for request_id, token_id in zip(request_ids, token_ids):
            entry = queues.get(request_id)
            if entry is not None:
                entry[0].put_nowait(OutputDelta(request_id, 0, [token_id], time=produced))

    def _dispatch(self, msg: Any) -> None:
        if isinstance(msg, StepOutputs):
            self._deliver_tokens(msg.token_requests, msg.token_ids, msg.time)
            self._deliver(msg.deltas)
            if msg.stats is not None:
                self._stats = msg.stats
        elif isinstance(msg, Phase):
            self._phase = msg.text
        elif isinstance(msg, Rejected):
            entry = self._queues.pop(msg.request_id, None)
            if entry is not None:
                entry[0].put_nowait(rebuild_error(msg.error))
        elif isinstance(msg, LoraReply):
            self._adapters = msg.adapters
            if msg.front_end != self.front_end.index:  # another front end's call: only the list changed
                return
            future = self._lora_calls.pop(msg.call_id, None)
            if future is not None and not future.done():
                if msg.error is None:
                    future.set_result(None)
                else:
                    future.set_exception(rebuild_error(msg.error))

    # ---- requests -----------------------------------------------------------------------------
    async def _add(self, request: GenerationRequest, prepared: PreparedRequest) -> Mailbox:
        self._check_ready()
        request_id = request.request_id
        if request_id in self._queues:
            raise InvalidRequestError(f"request_id {request_id!r} is already running", param="request_id")
        try:
            message = encoder.encode(AddRequest(request, prepared.prompt_token_ids, prepared.max_tokens,
                                                prepared.bad_words_ids, self.front_end.index))
        except OverflowError as exc:  # an option the engine ignores, holding a number past 64 bits
            raise InvalidRequestError(f"A number in the request is out of range: {exc}") from exc
        queue = Mailbox()
        self._queues[request_id] = (queue, request.sampling.n)
        self._send(message)
        return queue

    def _forget(self, request_id: str) -> None:
        self._queues.pop(request_id, None)
        self.abort(request_id)

    def _check_ready(self) -> None:
        if self._failure is not None:
            raise EngineNotReadyError(f"The engine is not serving: {self._failure}")
        if not self.ready:
            raise EngineNotReadyError(f"The engine is {'shutting down' if self._process else 'not started'}")

    def abort(self, request_id: str, index: int | None = None) -> None:
        if self._started and self._failure is None and not self._stopping:
            self._send(Abort([request_id], index))

    def stats(self) -> EngineStats:
        return self._stats.copy()

    # ---- LoRA adapters --------------------------------------------------------------------------
    def lora_adapters(self) -> dict[str, str] | None:
        return dict(self._adapters) if self._adapters is not None else dict(self.config.lora_modules)

    async def load_lora_adapter(self, name: str, path: str) -> None:
        await self._lora_call(name, path)

    async def unload_lora_adapter(self, name: str) -> None:
        await self._lora_call(name, None)

    async def _lora_call(self, name: str, path: str | None) -> None:
        self._check_ready()
        call_id = next(self._call_ids)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._lora_calls[call_id] = future
        self._send(LoraCall(call_id, name, path, self.front_end.index))
        await future


def _output_processor(tokenizer_path: str) -> OutputProcessor:
    outputs = OutputProcessor(Tokenizer.from_pretrained(tokenizer_path))
    _trim_heap()
    return outputs


def _trim_heap() -> None:
    """Hand the heap that loading the tokenizer freed back to the OS: glibc keeps it (about 30 MB of a front end's
    150 MB for SmolLM2's tokenizer, once per front end with --api-servers N)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
