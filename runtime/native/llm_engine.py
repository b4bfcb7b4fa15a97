"""NativeEngine: our PyTorch runtime behind the Engine interface, its EngineCore stepped by a thread.

The core (runtime/native/engine_core.py) knows no threads: this class gives it one. Requests and aborts from the event
loop wait in an inbox guarded by a Condition; the step thread takes them, calls `core.step()`, publishes the stats
and hands the step's output to the outbox (runtime/delivery.py: in-process, one `loop.call_soon_threadsafe` per
step and event loop into per-request asyncio queues read by `generate_batches`, whose text the front-end half makes:
runtime/async_engine.py; in the engine-core process, one message to the front end). The thread sleeps on the
Condition while idle.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runtime.async_engine import AsyncEngine
from runtime.native.block_manager import BlockManager
from runtime.config import EngineConfig
from runtime.native.core_loader import describe_model, load_core
from runtime.native.cpu.warm_up import CpuWarmUp
from runtime.engine import EngineStats
from runtime.native.engine_core import EngineCore
from runtime.errors import EngineNotReadyError, InvalidRequestError, QueueFullError
from runtime.native.lora import LoraManager
from runtime.native.model_runner import ModelRunner
from runtime.native.outbox import Outbox
from runtime.output_processor import OutputProcessor
from runtime.request import GenerationRequest
from runtime.native.request_state import RequestState
from runtime.native.scheduler import Scheduler
from runtime.native.speculative import Speculator
from runtime.startup import StartupPhases
from runtime.native.step_output import StepOutput
from runtime.validation import PreparedRequest
from runtime.workers import WorkerPool

if TYPE_CHECKING:  # xgrammar (and the transformers it imports, 0.8 s) loads with the first guided request
    from runtime.native.guided import GuidedCompiler, GuideState

logger = logging.getLogger(__name__)


class NativeEngine(AsyncEngine):
    """In-flight batching over a paged KV cache, in-process (see the module docstring)."""

    def __init__(self, config: EngineConfig, outbox: Outbox | None = None) -> None:
        self.config = config
        self.model = describe_model(config)
        self.model_path, self.spec = self.model.path, self.model.spec
        self.device, self.dtype = self.model.device, self.model.dtype
        self.model_info = self.model.info
        self.core: EngineCore | None = None  # once loaded
        self._cond = threading.Condition()
        self._inbox: list[RequestState] = []  # guarded by _cond, like the three fields below
        self._aborts: list[tuple[str, int | None]] = []  # (request id, the sample to end or None: all)
        self._active_ids: set[str] = set()
        self._num_waiting = 0  # the core's waiting requests as of the last step
        # the engine-core process passes one that sends to the front end, which makes the text; in-process, the
        # deltas go to this engine's own `generate_batches`, and the text is made here
        self._in_process = outbox is None
        self.outbox = outbox or Outbox(config.stream_interval)
        self._thread: threading.Thread | None = None
        self._accepting = False
        self._stopping = False
        self._loop_error: BaseException | None = None
        self._worker_failure: str | None = None  # why a tensor-parallel worker died (_worker_died)
        self._stats = EngineStats(max_batch_size=config.max_batch_size,
                                  max_num_tokens=self.model_info.max_num_tokens)
        self._stats_lock = threading.Lock()
        self._guided_compiler: GuidedCompiler | None = None
        self._guided_lock = threading.Lock()
        self._prepare = WorkerPool("prepare")  # tokenizing large prompts and bad words, off the event loop
        self.phases = StartupPhases()
        self.cpu_warm_up: CpuWarmUp | None = None  # the CPU's kernel and compiled steps, built while serving

    @property
    def phase(self) -> str | None:
        return self.phases.current

    # the core's parts, for tests and benchmarks
    @property
    def scheduler(self) -> Scheduler:
        return self._loaded_core().scheduler

    @property
    def block_manager(self) -> BlockManager:
        return self._loaded_core().block_manager

    @property
    def runner(self) -> ModelRunner:
        return self._loaded_core().runner

    @property
    def lora(self) -> LoraManager:
        return self._loaded_core().lora

    @property
    def speculator(self) -> Speculator | None:
        return self._loaded_core().speculator

    def _loaded_core(self) -> EngineCore:
        if self.core is None:
            raise EngineNotReadyError("The engine is not started")
        return self.core

    # ---- lifecycle ----------------------------------------------------------------------------
    def load(self) -> None:
        """Load tokenizer, weights and KV cache (blocking; `start` runs it in a worker thread)."""
        if self.core is not None:
            return
        loaded = load_core(self.config, self.model, self.phases, on_lora_ready=self._wake,
                           stopping=lambda: not self._accepting, on_worker_failure=self._worker_died)
        self.tokenizer, self.eos_token_ids = loaded.tokenizer, loaded.eos_token_ids
        self.cpu_warm_up = loaded.cpu_warm_up
        if self._in_process:
            with self.phases.phase("building the detokenizer's table"):
                self.outputs = OutputProcessor(self.tokenizer)
        st, blocks = self._stats, loaded.core.block_manager.num_blocks
        st.kv_blocks_total = st.kv_blocks_free = blocks
        st.kv_tokens_per_block = self.config.kv_block_size
        st.memory_bytes = dict(loaded.memory_bytes)
        self.core = loaded.core

    async def start(self) -> None:
        if self._thread is not None:
            return
        await asyncio.to_thread(self.load)
        # Full collections rescanning the loaded heap (model, tokenizer, transformers' modules) cost 10-16% of
        # throughput at batch 256 on CUDA, and on the 2-core CPU 2.7 ms of a 256-row step's 3.4 ms of output
        # handling (benchmarks/RESULTS.md): keep that heap out of them (until shutdown, see there). Only the young
        # generations are collected first: a full collection here took 0.13-0.3 s, a start of every engine test.
        gc.collect(1)
        gc.freeze()
        self._thread = threading.Thread(target=self._run, name="native-engine", daemon=True)
        self._accepting = True
        self._thread.start()
        if self.cpu_warm_up is not None:
            self.cpu_warm_up.start()

    async def shutdown(self, drain_timeout: float = 0.0) -> None:
        self._accepting = False
        if self._thread is None:
            return
        deadline = time.monotonic() + drain_timeout
        while self._busy() and time.monotonic() < deadline and self._thread.is_alive():
            await asyncio.sleep(0.01)
        with self._cond:
            self._aborts.extend((request_id, None) for request_id in self._active_ids)
            self._stopping = True
            self._cond.notify()
        await asyncio.to_thread(self._thread.join)
        self._prepare.shutdown()
        if self.core is not None and self.core.runner.peers is not None:
            self.core.runner.release_graphs()
            await asyncio.to_thread(self.core.runner.peers.stop)
        gc.unfreeze()  # what this engine held may be freed by the collector again (tests start many engines)

    @property
    def ready(self) -> bool:
        return self._accepting and self.loop_alive and self._loop_error is None and self._worker_failure is None

    @property
    def loop_alive(self) -> bool:
        """Whether the step thread still runs (after it dies, every request it held has had its error handed over)."""
        return self._thread is not None and self._thread.is_alive()

    def _busy(self) -> bool:
        with self._cond:
            return bool(self._active_ids)

    # ---- LoRA adapters --------------------------------------------------------------------------
    def lora_adapters(self) -> dict[str, str] | None:
        return self.lora.adapters() if self.core is not None else dict(self.config.lora_modules)

    async def load_lora_adapter(self, name: str, path: str) -> None:
        await asyncio.to_thread(self.lora.register, name, path)

    async def unload_lora_adapter(self, name: str) -> None:
        self.lora.unregister(name)

    # ---- requests -----------------------------------------------------------------------------
    async def _add(self, request: GenerationRequest, prepared: PreparedRequest) -> asyncio.Queue[Any]:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        await self.submit(request, prepared, queue)
        return queue

    async def submit(self, request: GenerationRequest, prepared: PreparedRequest,
                     queue: asyncio.Queue[Any] | None = None) -> None:
        """Hand a validated request to the step thread; its deltas go to `queue` (in-process) or wherever
        this engine's outbox sends them. Raises the engine's refusals (queue full, grammar, adapter...)."""
        new_guide = None
        if request.guided is not None:  # a new grammar takes up to seconds to compile: off the event loop
            new_guide = await self._guides().guide_factory_async(request.guided)
        self._submit(request, prepared, new_guide, queue)

    def _check_ready(self) -> None:
        if not self.ready:
            reason = "shutting down" if self._thread is not None else "not started"
            raise EngineNotReadyError(f"The engine is {reason}")

    def _submit(self, request: GenerationRequest, prepared: PreparedRequest,
                new_guide: Callable[[], GuideState] | None, queue: asyncio.Queue[Any] | None) -> RequestState:
        self._check_ready()
        block_manager = self.block_manager
        if self.config.scheduler_policy == "guaranteed_no_evict":
            fanout = max(request.sampling.n, request.sampling.beam_width)
            need = fanout * block_manager.blocks_for(len(prepared.prompt_token_ids) + prepared.max_tokens)
            if need > block_manager.num_blocks:
                raise InvalidRequestError(
                    f"n x (prompt + max_tokens) needs {need} KV blocks, more than the cache holds "
                    f"({block_manager.num_blocks})",
                    param="max_tokens",
                )
        lora_weights = self.lora.prepare(request)  # parses a Triton task's inline weights (no lock held)
        state = RequestState(
            request,
            prepared,
            eos_token_ids=self.eos_token_ids,
            context_window=self.model_info.context_window,
            device=self.device,
            loop=asyncio.get_running_loop() if queue is not None else None,
            queue=queue,
            new_guide=new_guide,
        )
        with self._cond:
            if request.request_id in self._active_ids:
                raise InvalidRequestError(f"request_id {request.request_id!r} is already running", param="request_id")
            if len(self._inbox) + self._num_waiting >= self.config.max_queue_size:
                raise QueueFullError(f"The request queue is full ({self.config.max_queue_size} waiting requests)")
            state.adapter_key = self.lora.acquire(request.request_id, request, lora_weights)
            self._active_ids.add(request.request_id)
            self._inbox.append(state)
            self._cond.notify()
        return state

    def _guides(self) -> GuidedCompiler:
        """Grammar compiler for this tokenizer, made on the first guided request."""
        with self._guided_lock:  # first guided requests may arrive together (worker threads)
            if self._guided_compiler is None:
                from runtime.native.guided import GuidedCompiler

                self._guided_compiler = GuidedCompiler(self.tokenizer.hf, self.spec.vocab_size, self.eos_token_ids)
            return self._guided_compiler

    def abort(self, request_id: str, index: int | None = None) -> None:
        with self._cond:
            if request_id in self._active_ids:
                self._aborts.append((request_id, index))
                self._cond.notify()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def _worker_died(self, reason: str) -> None:
        """A tensor-parallel worker died: the step loop dies at its next turn (every request fails, the engine turns
        not ready; the engine-core process then exits non-zero)."""
        with self._cond:
            self._worker_failure = reason
            self._cond.notify()

    # ---- the step thread ----------------------------------------------------------------------
    def _run(self) -> None:
        core = self.core
        assert core is not None
        try:
            while True:
                with self._cond:
                    while not (self._called() or core.has_work()):
                        self._cond.wait()
                    if self._worker_failure is not None:
                        raise RuntimeError(self._worker_failure)
                    if self._stopping and not self._aborts:
                        break
                if self.step() == 0:
                    # work is queued but cannot run yet: do not spin, but take a new request at once (a sleep here
                    # delayed the next request of a one-stream client by up to its length)
                    with self._cond:
                        if not self._called():
                            self._cond.wait(0.001)
        except BaseException as exc:  # the loop must never die silently: fail everyone, turn not ready
            logger.exception("native engine loop died")
            self._loop_error = exc
            self._fail_everything(f"EngineFailedError: the engine loop died: {exc!r}")

    def _called(self) -> bool:
        """Whether the step thread has something to take besides queued work: a new request, an abort, the shutdown,
        a dead worker (under self._cond)."""
        return bool(self._stopping or self._inbox or self._aborts or self._worker_failure)

    def step(self) -> int:
        """Hand new requests and aborts to the core, run one core step and hand its output over. Returns the number
        of sequences the step ran."""
        core = self.core
        assert core is not None
        with self._cond:
            inbox, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, []
            self._num_waiting += len(inbox)  # still counted against max_queue_size until the next publish
        for state in inbox:
            core.add_request(state)
        for request_id, index in aborts:
            core.abort(request_id, index)
        out = core.step()
        with self._stats_lock:
            core.publish_stats(self._stats)
            waiting = self._stats.waiting
        self._hand_over(out, waiting)
        return out.num_scheduled

    def _hand_over(self, out: StepOutput, waiting: int | None = None) -> None:
        """Forget the requests that ended, then pass the output on."""
        ended = out.ended()
        with self._cond:
            self._active_ids.difference_update(ended)
            if waiting is not None:
                self._num_waiting = waiting
        self.outbox.put(out)

    def _fail_everything(self, error: str) -> None:
        try:
            with self._cond:
                inbox, self._inbox = self._inbox, []
            assert self.core is not None
            self._hand_over(self.core.fail_all(error, inbox))
        except Exception:
            logger.exception("failed to fail the outstanding requests")

    # ---- stats --------------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        with self._stats_lock:
            snapshot = self._stats.copy()
        with self._cond:
            snapshot.waiting += len(self._inbox)
        return snapshot
