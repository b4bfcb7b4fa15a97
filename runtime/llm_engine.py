"""NativeEngine: our PyTorch runtime behind the Engine interface.

A background thread runs the step loop: take new requests and aborts, schedule (runtime/scheduler.py),
run the model and sample (runtime/model_runner.py), turn tokens into deltas (runtime/request_state.py).
Deltas cross to the event loop through runtime/delivery.py (one `loop.call_soon_threadsafe` per step and
event loop) into per-request asyncio queues read by `generate_batches()`. The thread sleeps on a Condition
while idle.

Async scheduling (on by default on CUDA): a step whose sequences need no host-side token knowledge
(`RequestState.overlappable`) is launched without waiting for it; its sampled tokens hold their places as
PENDING_TOKEN and feed the next step on the device. While the device runs step N, the thread schedules and
launches step N+1, then collects step N's tokens and turns them into deltas: stop conditions are seen one
step late, so a finished sequence may compute one extra token, which is discarded. Any other step first
collects the step in flight (a synchronous step); so does one where speculation may propose drafts (its
proposers read the tokens), which then runs one ahead if nothing was proposed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import torch

from runtime.block_manager import BlockManager
from runtime.config import EngineConfig
from runtime.cpu.defaults import CpuFeatures, cpu_dtype, cpu_quantization, log_choice, source_quantization
from runtime.cpu.native_decode import NativeDecode, supports
from runtime.cpu.paged_attention import build_kernel, use_cpu_kernels
from runtime.cpu.warm_up import CpuWarmUp
from runtime.delivery import Outbox, read_batches
from runtime.default_model import DEMO, resolve_model
from runtime.device import cpu_thread_count, dtype_name, resolve_device, resolve_dtype
from runtime.engine import Engine, EngineStats, ModelInfo, deltas_of
from runtime.errors import EngineNotReadyError, InvalidRequestError, QueueFullError
from runtime.guided import GuidedCompiler, GuideState
from runtime.kv_cache import num_kv_blocks
from runtime.lora import LoraManager
from runtime.model_runner import ModelRunner, PendingStep
from runtime.models import ModelSpec, check_supported, kv_cache_bytes_per_token, load_model
from runtime.models.cpu_weights import prepare_cpu_weights
from runtime.output_text import text_in_front_end
from runtime.request import GenerationRequest, OutputDelta
from runtime.request_state import RequestState
from runtime.sampler import Sampler
from runtime.scheduler import ScheduledBatch, ScheduledSeq, Scheduler
from runtime.sequence import PENDING_TOKEN, SequenceStatus
from runtime.speculative import Speculator, build_speculator, load_proposer
from runtime.startup import StartupPhases
from runtime.step_inputs import NO_SAMPLES, StepInputs
from runtime.step_results import StepResult, StepResults
from runtime.tokenizer import Tokenizer
from runtime.validation import PreparedRequest, validate_request
from runtime.workers import WorkerPool, is_heavy

logger = logging.getLogger(__name__)


def describe_model(config: EngineConfig) -> tuple[str, ModelSpec, torch.device, torch.dtype, ModelInfo]:
    """(checkpoint folder, its spec, device, dtype, what the gateway is told) without loading weights."""
    model_path, default_name = resolve_model(config.model, config.dtype)
    spec = ModelSpec.from_pretrained(model_path)
    check_supported(spec)  # one line at start-up naming what we do not serve, before any weight is read
    device = resolve_device(config.device)
    if device.type == "cpu":
        dtype = cpu_dtype(config.dtype, spec.torch_dtype, source_quantization(spec.config), CpuFeatures.detect())
    else:
        dtype = resolve_dtype(config.dtype, device, spec.torch_dtype)
    window = config.max_model_len or spec.max_position_embeddings
    if window > spec.max_position_embeddings:
        raise ValueError(
            f"max_model_len {window} exceeds the model's max_position_embeddings ({spec.max_position_embeddings})"
        )
    name = config.served_model_name or default_name
    info = ModelInfo(name=name, context_window=window, vocab_size=spec.vocab_size, backend="native",
                     dtype=dtype_name(dtype), device=str(device))
    return model_path, spec, device, dtype, info


class NativeEngine(Engine):
    """In-flight batching over a paged KV cache, in-process (see the module docstring)."""

    def __init__(self, config: EngineConfig, outbox: Outbox | None = None, text_in_front_end: bool = False) -> None:
        self.config = config
        # the engine-core process: requests that `output_text.text_in_front_end` picks get no text here
        self._text_in_front_end = text_in_front_end
        self.model_path, self.spec, self.device, self.dtype, self.model_info = describe_model(config)
        self._cond = threading.Condition()
        self._inbox: list[RequestState] = []  # guarded by _cond, like the three fields below
        self._aborts: list[str] = []
        self._active_ids: set[str] = set()
        self._num_waiting = 0  # scheduler's waiting requests as of the last step
        self._requests: dict[str, RequestState] = {}  # loop thread only
        self._with_deadline: dict[str, RequestState] = {}  # those of _requests that have a deadline
        # the engine-core process passes one that sends to the front end
        self.outbox = outbox or Outbox(config.stream_interval)
        self._thread: threading.Thread | None = None
        self._accepting = False
        self._stopping = False
        self._loop_error: BaseException | None = None
        self._stats = EngineStats(max_batch_size=config.max_batch_size, max_num_tokens=config.max_num_tokens)
        self._stats_lock = threading.Lock()
        self._loaded = False
        self._guided_compiler: GuidedCompiler | None = None
        self._guided_lock = threading.Lock()
        self.speculator: Speculator | None = None
        async_scheduling = config.async_scheduling
        self._async_scheduling = self.device.type == "cuda" if async_scheduling is None else async_scheduling
        self._inflight: tuple[ScheduledBatch, PendingStep] | None = None  # launched, tokens not collected yet
        self._inflight_rows: dict[int, int] = {}  # seq_id -> its row in the in-flight step's sampled ids
        self._prepare = WorkerPool("prepare")  # tokenizing large prompts and bad words, off the event loop
        self.phases = StartupPhases()
        self.cpu_warm_up: CpuWarmUp | None = None  # the CPU's kernel and compiled steps, built while serving

    @property
    def phase(self) -> str | None:
        return self.phases.current

    # ---- lifecycle ----------------------------------------------------------------------------
    def load(self) -> None:
        """Load tokenizer, weights and KV cache (blocking; `start` runs it in a worker thread)."""
        if self._loaded:
            return
        cfg = self.config
        phase = self.phases.phase
        if self.device.type == "cpu":
            torch.set_num_threads(cpu_thread_count(cfg.cpu_threads))  # process-wide: the step thread's matmuls
        with phase("loading the tokenizer"):
            self.tokenizer = Tokenizer.from_pretrained(cfg.tokenizer or self.model_path)
            _ = self.tokenizer.byte_pieces  # the detokenizers' table, built at load time, not on the first request
        self.eos_token_ids = list(dict.fromkeys(self.tokenizer.eos_token_ids + self.spec.eos_token_ids))
        with phase("loading the weights"):
            model = load_model(self.model_path, self.dtype, self.device, self.model_info.context_window,
                               cfg.quantization)
        quantization, cpu_weight_bytes = "none", 0
        if self.device.type == "cpu":
            quantization = cpu_quantization(cfg.cpu_quantization, source_quantization(self.spec.config))
            use_cpu_kernels(False)  # until the kernel is built (runtime/cpu/warm_up.py), whatever engines did before
            if quantization != "none":
                with phase("building the CPU kernels"):  # the quantized products need them (cached after a first start)
                    if not build_kernel():
                        logger.warning("CPU: no kernels for --cpu-quantization %s; serving without it", quantization)
                        quantization = "none"
            cpu_weight_bytes = prepare_cpu_weights(model, quantization)
            if cpu_weight_bytes:
                logger.info("CPU: %s weights (%+.0f MB)", "prepacked" if quantization == "none" else
                            f"{quantization} weight-only", cpu_weight_bytes / 2**20)
        self.runner = ModelRunner(model, cfg.kv_block_size, Sampler(cfg.seed))
        self.lora = LoraManager(cfg, model, on_ready=self._wake)
        self.runner.lora = self.lora.batch
        window = self.model_info.context_window
        proposer = load_proposer(cfg, serving_demo=cfg.model == DEMO, tokenizer=self.tokenizer,
                                 vocab_size=self.spec.vocab_size, dtype=self.dtype, device=self.device)
        activations = self.runner.profile_activation_bytes(cfg.max_num_tokens, cfg.max_batch_size, window)
        bytes_per_token = kv_cache_bytes_per_token(self.spec, self.dtype)
        bytes_per_token += getattr(proposer, "kv_bytes_per_token", 0)  # a draft model's cache gets as many blocks
        blocks = num_kv_blocks(cfg, bytes_per_token, window, self.device, activations)
        # a compiled step on CPU pays with --cpu-quantization or float32 (not against the prepacked bf16 products,
        # which inductor cannot call: 45 vs 52 ms a SmolLM2 step on the 2-core box, RESULTS.md); it is warmed up
        # in one more block, which the block manager never hands out
        native = self.device.type == "cpu" and cfg.cpu_compile and supports(model) is None
        compile_steps = (self.device.type == "cpu" and cfg.cpu_compile and not native and
                         (quantization != "none" or self.dtype != torch.bfloat16))
        self.runner.allocate_kv_cache(blocks + compile_steps)
        # a speculative step brings 1 + num_draft_tokens rows per sequence
        decode_rows = cfg.max_batch_size * (1 + (cfg.num_draft_tokens if proposer is not None else 0))
        max_blocks = -(-window // cfg.kv_block_size)
        if cfg.enable_cuda_graphs and self.device.type == "cuda":
            self.runner.capture_decode_graphs(decode_rows, max_blocks, lora_version=lambda: self.lora.slots.version)
            self.runner.capture_prefill_graphs(cfg.max_num_tokens, max_blocks,
                                               lora_version=lambda: self.lora.slots.version)
        if native:  # its kernels are built: it serves from the first step
            use_cpu_kernels(True)
            self.runner.graphs = NativeDecode(model, self.runner.kv_caches, cfg.kv_block_size, max_blocks, self.lora.batch)
        elif self.device.type == "cpu" and cfg.cpu_compile:
            self.cpu_warm_up = CpuWarmUp(self.runner, self.phases, compile_steps, max_blocks, scratch_block=blocks,
                                         stopping=lambda: not self._accepting)
        if self.device.type == "cpu":
            steps = ("C++ decode steps" if native else "compiled one-stream steps (built in the background)"
                     if compile_steps else "eager steps")
            log_choice(self.dtype, quantization, torch.get_num_threads(), steps, CpuFeatures.detect())
        # blocks outside every layer's window are given back, unless a draft model (full attention) reads them
        sliding = self.spec.sliding_window if cfg.speculative != "draft" else None
        self.block_manager = BlockManager(blocks, cfg.kv_block_size, cfg.enable_prefix_caching, sliding)
        self.runner.block_tables = self.block_manager.tables
        self.scheduler = Scheduler(
            self.block_manager,
            max_batch_size=cfg.max_batch_size,
            max_num_tokens=cfg.max_num_tokens,
            policy=cfg.scheduler_policy,
            enable_chunked_prefill=cfg.enable_chunked_prefill,
        )
        if proposer is not None:
            self.speculator = build_speculator(proposer, cfg, self.block_manager, window,
                                               cuda_graphs=self.device.type == "cuda" and self.runner.graphs is not None)
        weights = sum(p.numel() * p.element_size() for p in model.parameters()) + cpu_weight_bytes
        weights += getattr(proposer, "weight_bytes", 0) + getattr(getattr(proposer, "runner", None), "kv_cache_bytes", 0)
        self._memory = {"gpu" if self.device.type == "cuda" else "cpu": weights + self.runner.kv_cache_bytes}
        self._stats.kv_blocks_total = self._stats.kv_blocks_free = blocks
        self._stats.kv_tokens_per_block = cfg.kv_block_size
        self._stats.memory_bytes = dict(self._memory)
        self._loaded = True

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
            self._aborts.extend(self._active_ids)
            self._stopping = True
            self._cond.notify()
        await asyncio.to_thread(self._thread.join)
        self._prepare.shutdown()
        gc.unfreeze()  # what this engine held may be freed by the collector again (tests start many engines)

    @property
    def ready(self) -> bool:
        alive = self._thread is not None and self._thread.is_alive()
        return self._accepting and alive and self._loop_error is None

    def _busy(self) -> bool:
        with self._cond:
            return bool(self._active_ids)

    # ---- LoRA adapters --------------------------------------------------------------------------
    def lora_adapters(self) -> dict[str, str] | None:
        return self.lora.adapters() if self._loaded else dict(self.config.lora_modules)

    async def load_lora_adapter(self, name: str, path: str) -> None:
        if not self._loaded:
            raise EngineNotReadyError("The engine is not started")
        await asyncio.to_thread(self.lora.register, name, path)

    async def unload_lora_adapter(self, name: str) -> None:
        if not self._loaded:
            raise EngineNotReadyError("The engine is not started")
        self.lora.unregister(name)

    # ---- requests -----------------------------------------------------------------------------
    def generate(self, request: GenerationRequest) -> AsyncIterator[OutputDelta]:
        return deltas_of(self.generate_batches(request))

    async def generate_batches(self, request: GenerationRequest) -> AsyncIterator[list[OutputDelta]]:
        """Every delta already queued for the request, in one list per wake-up (one or more steps')."""
        self._check_ready()  # preparing needs the loaded tokenizer
        prepared = await self._prepare.call(is_heavy(request), self._validate, request)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        await self.submit(request, prepared, queue)
        # the consumer leaving early (client gone) aborts the request, which frees its blocks
        async with contextlib.aclosing(read_batches(queue, lambda: self.abort(request.request_id))) as batches:
            async for batch in batches:
                yield batch

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

    def _validate(self, request: GenerationRequest) -> PreparedRequest:
        return validate_request(request, tokenizer=self.tokenizer, vocab_size=self.spec.vocab_size,
                                context_window=self.model_info.context_window, config=self.config)

    def _submit(self, request: GenerationRequest, prepared: PreparedRequest,
                new_guide: Callable[[], GuideState] | None, queue: asyncio.Queue[Any] | None) -> RequestState:
        self._check_ready()
        if self.config.scheduler_policy == "guaranteed_no_evict":
            fanout = max(request.sampling.n, request.sampling.beam_width)
            need = fanout * self.block_manager.blocks_for(len(prepared.prompt_token_ids) + prepared.max_tokens)
            if need > self.block_manager.num_blocks:
                raise InvalidRequestError(
                    f"n x (prompt + max_tokens) needs {need} KV blocks, more than the cache holds "
                    f"({self.block_manager.num_blocks})",
                    param="max_tokens",
                )
        lora_weights = self.lora.prepare(request)  # parses a Triton task's inline weights (no lock held)
        state = RequestState(
            request,
            prepared,
            tokenizer=self.tokenizer,
            eos_token_ids=self.eos_token_ids,
            context_window=self.model_info.context_window,
            device=self.device,
            loop=asyncio.get_running_loop() if queue is not None else None,
            queue=queue,
            new_guide=new_guide,
            makes_text=not (self._text_in_front_end and text_in_front_end(request.sampling)),
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
                self._guided_compiler = GuidedCompiler(self.tokenizer.hf, self.spec.vocab_size, self.eos_token_ids)
            return self._guided_compiler

    def abort(self, request_id: str) -> None:
        with self._cond:
            if request_id in self._active_ids:
                self._aborts.append(request_id)
                self._cond.notify()

    # ---- the loop -----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not (self._stopping or self._inbox or self._aborts or self.scheduler.has_work()
                               or self._inflight is not None or self.lora.has_admissible()):
                        self._cond.wait()
                    if self._stopping and not self._aborts:
                        break
                if self.step() == 0 and not self._aborts:
                    time.sleep(0.001)  # work is queued but cannot run yet; do not spin
        except BaseException as exc:  # the loop must never die silently: fail everyone, turn not ready
            logger.exception("native engine loop died")
            self._loop_error = exc
            self._fail_everything(f"EngineFailedError: the engine loop died: {exc!r}")

    def step(self) -> int:
        """One iteration: admit, abort, schedule, run, emit. Returns the number of sequences run."""
        self._take_inbox()
        self._admit_adapters()
        self._expire_deadlines()
        batch = self.scheduler.schedule()
        if batch:
            self._stats.iterations += 1
            self._run_batch(batch)
        else:
            self._collect_inflight()
        self._publish_stats(batch)
        self.outbox.flush()
        return len(batch)

    def _take_inbox(self) -> None:
        with self._cond:
            inbox, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, []
            self._num_waiting += len(inbox)  # still counted against max_queue_size until the next publish
        for state in inbox:
            self._requests[state.request_id] = state
            try:
                if state.request.deadline is not None:
                    self._with_deadline[state.request_id] = state
                if state.adapter_key is None:
                    self.scheduler.add(state.new_sequence())
                else:  # waits in the LoRA manager until its adapter sits in a device slot
                    self.lora.enqueue(state.request_id)
            except Exception as exc:  # noqa: BLE001 - one request that cannot start fails alone
                self._fail_request(state, "could not start", exc)
        for request_id in aborts:
            state = self._requests.get(request_id)
            if state is not None:
                self._end(state, state.end_all("abort"))

    def _admit_adapters(self) -> None:
        """Schedule requests whose LoRA adapter is now on the device; fail those whose load failed."""
        ready, failed = self.lora.admit()
        for request_id in ready:
            state = self._requests[request_id]
            try:
                self.scheduler.add(state.new_sequence())
            except Exception as exc:  # noqa: BLE001
                self._fail_request(state, "could not start", exc)
        for request_id, error in failed:
            state = self._requests[request_id]
            self._end(state, state.end_all("error", f"EngineFailedError: {error}"))

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def _expire_deadlines(self) -> None:
        now = time.monotonic()
        for state in list(self._with_deadline.values()):
            if now > state.request.deadline:  # type: ignore[operator]
                self._end(state, state.end_all("abort"))

    def _run_batch(self, batch: ScheduledBatch) -> None:
        overlap = self._overlappable(batch)
        spec = self.speculator
        may_speculate = spec is not None and spec.begin_step(batch, self._requests)
        # proposing drafts needs every token on the host, as does a step that cannot run one ahead: finish the step
        # in flight first
        if not overlap or may_speculate:
            self._collect_inflight()
            batch.drop_finished()
            if not batch:
                return
        if spec is not None:
            spec.plan(batch, self._requests)  # drafts for speculating decode entries (runtime/speculative)
            # a step that verifies drafts ends on the host; one where nothing was proposed still runs one ahead
            overlap = overlap and not spec.proposed
        try:  # a step that cannot be built or launched fails its requests, not the engine
            inputs = self._step_inputs(batch)
            if spec is not None:
                inputs = spec.patch_inputs(batch, inputs)
            pending = self.runner.launch(inputs, batch.copies)
        except Exception as exc:  # noqa: BLE001 - one failed step fails its requests, not the engine
            self._fail_batch(batch, exc)
            return
        self._collect_inflight()  # step N's tokens, while the device runs step N+1 (no-op when synchronous)
        if overlap:
            self.scheduler.advance(batch)
            self._hold_places(batch)
            self._inflight = (batch, pending)
            return
        try:
            results = pending.collect()
            if spec is not None:
                spec.verify(batch, results)  # accepted drafts join; rejected tokens' KV is rolled back
        except Exception as exc:  # noqa: BLE001
            self._fail_batch(batch, exc)
            return
        self.scheduler.advance(batch)
        self._process(batch, results)

    def _overlappable(self, batch: ScheduledBatch) -> bool:
        """Whether the step may run before the host knows the tokens of the step in flight (async scheduling)."""
        if not self._async_scheduling:
            return False
        requests = self._requests
        return all(not samples or (requests[seq.request_id].overlappable and seq.num_samples == 1)
                   for seq, samples in zip(batch.seqs, batch.samples))

    def _hold_places(self, batch: ScheduledBatch) -> None:
        """Sequences sampled by the launched step get PENDING_TOKEN, so the next step can schedule them; not
        those whose sampled token is surely their last (max_tokens, context window)."""
        rows: dict[int, int] = {}
        requests, window = self._requests, self.model_info.context_window
        for seq, samples in zip(batch.seqs, batch.samples):
            if not samples:
                continue
            rows[seq.seq_id] = len(rows)
            if seq.status is SequenceStatus.FINISHED:  # ended while the step was being launched
                continue
            state = requests[seq.request_id]
            token_ids = seq.token_ids
            if state.samples[seq.index].num_tokens + 1 < state.max_tokens and len(token_ids) + 1 < window:
                token_ids.append(PENDING_TOKEN)
        self._inflight_rows = rows

    def _collect_inflight(self) -> None:
        """Wait for the step in flight and turn its tokens into deltas."""
        if self._inflight is None:
            return
        (batch, pending), self._inflight = self._inflight, None
        self._inflight_rows = {}
        try:
            results = pending.collect()
        except Exception as exc:  # noqa: BLE001
            self._fail_batch(batch, exc)
            return
        self._process(batch, results)

    def _fail_batch(self, batch: ScheduledBatch, exc: Exception) -> None:
        logger.exception("model step failed", exc_info=exc)
        for request_id in dict.fromkeys(seq.request_id for seq in batch.seqs):
            state = self._requests.get(request_id)
            if state is not None:
                self._end(state, state.end_all("error", f"EngineFailedError: model step failed: {exc!r}"))

    def _process(self, batch: ScheduledBatch, results: StepResults) -> None:
        """Turn a finished step's results into deltas, and end the requests that finished. A token of a
        `token_only` request that cannot end it is only counted and handed to the outbox as an id (no delta)."""
        produced: dict[str, list[OutputDelta]] = {}
        spec = self.speculator if self.speculator is not None and self.speculator.proposed else None
        plain_tokens = 0
        first_ids, prefill = results.first_ids(), batch.prefill
        for b, seq in enumerate(batch.seqs):
            state = self._requests.get(seq.request_id)
            if state is None or seq.status is SequenceStatus.FINISHED:
                continue
            try:
                if (state.token_only and not prefill[b] and (token_id := first_ids[b]) is not None
                        and (spec is None or not spec.verifies(seq)) and state.add_plain_token(seq, token_id)):
                    seq.add_sampled(token_id)
                    self.outbox.add_token(state, token_id)
                    plain_tokens += 1
                    continue
                produced.setdefault(state.request_id, []).extend(
                    self._postprocess(state, ScheduledSeq(batch, b), results[b]))
            except Exception as exc:  # noqa: BLE001 - a bug in one request's output fails that request only
                self._fail_request(state, "output processing failed", exc, produced.pop(state.request_id, []))
        self._stats.generation_tokens_total += plain_tokens
        for request_id, deltas in produced.items():
            state = self._requests[request_id]
            if state.finished:
                self._end(state, deltas)
            else:
                self.outbox.emit(state, deltas)

    def _step_inputs(self, batch: ScheduledBatch) -> StepInputs:
        """The step's inputs, written column by column (runtime/step_inputs.py): no object per row."""
        inputs = StepInputs()
        add, requests, inflight_rows = inputs.add, self._requests, self._inflight_rows
        for b, (seq, num_new, samples) in enumerate(zip(batch.seqs, batch.num_new, batch.samples)):
            state = requests[seq.request_id]
            start = seq.num_computed_tokens
            token_ids = seq.token_ids
            add(token_ids, start, num_new, start, seq.block_table, seq.table_row,
                state.sampling_rows(seq) if samples else NO_SAMPLES,
                inflight_rows.get(seq.seq_id, -1) if token_ids[-1] == PENDING_TOKEN else -1,
                self.lora.slot_of(seq.request_id) if state.adapter_key is not None else -1)
            if state.wants_prompt_logits and state.needs_prompt_logits and start < seq.num_prompt_tokens:
                inputs.all_logits.add(b)
            # beam search ranks continuations by the raw next-token logits (runtime/beam_search.py)
            if samples and (state.options.return_generation_logits or state.beam is not None):
                inputs.sample_logits.add(b)
        return inputs

    def _postprocess(self, state: RequestState, entry: ScheduledSeq, result: StepResult) -> list[OutputDelta]:
        seq = entry.seq
        if entry.cached_tokens is not None:
            self._stats.prefix_cache_hit_tokens += entry.cached_tokens
            if seq.num_preemptions == 0:
                state.num_cached_tokens = entry.cached_tokens
                self._stats.prompt_tokens_total += seq.num_prompt_tokens
        if entry.is_prefill:
            self._stats.prefill_tokens_computed += entry.num_new_tokens
        if result.all_logits is not None:
            state.add_prompt_logits(seq.num_computed_tokens - entry.num_new_tokens, result.all_logits)
            seq.needs_prompt_logits = state.needs_prompt_logits
        if not result.token_ids:
            return []
        if self.speculator is not None:
            spec_deltas = self.speculator.emit(state, entry, result, self.scheduler)
            if spec_deltas is not None:
                self._stats.generation_tokens_total += len(spec_deltas)
                return spec_deltas
        if state.beam is not None:  # the beams advance together once all of them reported
            self._stats.generation_tokens_total += state.beam.advance(seq, result.sample_logits, self.scheduler)
            state.seqs = {s.seq_id: s for s in state.beam.sequences}
            return state.beam.final_deltas() if state.beam.done else []
        seqs = [seq]
        if seq.num_samples > 1:  # the prompt is done: fork into n samples sharing its blocks
            seqs += [self.scheduler.fork(seq, i) for i in range(1, seq.num_samples)]
            seq.num_samples = 1
            state.seqs.update((s.index, s) for s in seqs)
        deltas = []
        for s, token_id, logprob, top in zip(seqs, result.token_ids, result.logprobs, result.top):
            s.add_sampled(token_id)
            self._stats.generation_tokens_total += 1
            deltas.append(state.add_token(s, token_id, logprob, top, result.sample_logits))
            if state.samples[s.index].finish_reason is not None:
                self.scheduler.finish(s)
                state.seqs.pop(s.index, None)
        return deltas

    # ---- ending requests ----------------------------------------------------------------------
    def _end(self, state: RequestState, deltas: list[OutputDelta]) -> None:
        """Emit the request's last deltas, then drop it and free its blocks."""
        for seq in list(state.seqs.values()):
            self.scheduler.finish(seq)
        state.seqs.clear()
        self.lora.finish(state.request_id)
        self.outbox.emit(state, deltas, final=True)
        self._requests.pop(state.request_id, None)
        self._with_deadline.pop(state.request_id, None)
        with self._cond:
            self._active_ids.discard(state.request_id)

    def _fail_request(self, state: RequestState, what: str, exc: Exception,
                      deltas: list[OutputDelta] | None = None) -> None:
        """End one request with an error (after its `deltas`): what it brought broke a step for it alone."""
        logger.exception("%s for request %s", what, state.request_id, exc_info=exc)
        self._end(state, [*(deltas or []), *state.end_all("error", f"EngineFailedError: {what}: {exc!r}")])

    def _fail_everything(self, error: str) -> None:
        try:
            with self._cond:
                inbox, self._inbox = self._inbox, []
            for state in inbox:
                self._requests[state.request_id] = state
            for state in list(self._requests.values()):
                state.seqs.clear()  # the scheduler may be inconsistent; its blocks no longer matter
                self._end(state, state.end_all("error", error))
            self.outbox.flush()
        except Exception:  # noqa: BLE001
            logger.exception("failed to fail the outstanding requests")

    # ---- stats --------------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        with self._stats_lock:
            snapshot = self._stats.copy()
        with self._cond:
            snapshot.waiting += len(self._inbox)
        return snapshot

    def _publish_stats(self, batch: ScheduledBatch) -> None:
        # requests with a running sequence; else with a preempted one; else waiting (from the scheduler's queues: a
        # look at every request's sequences took 3% of a 256-row step's host time, H200)
        running_ids = {s.request_id for s in self.scheduler.running}
        paused_ids = {s.request_id for s in self.scheduler.waiting if s.num_preemptions} - running_ids
        running, paused = len(running_ids), len(paused_ids)
        waiting = len(self._requests) - running - paused
        prefill = [(seq.request_id, n) for seq, n, p in zip(batch.seqs, batch.num_new, batch.prefill) if p]
        bm = self.block_manager
        with self._stats_lock:
            st = self._stats
            st.waiting, st.running, st.paused = waiting, running, paused
            st.scheduled = len({seq.request_id for seq in batch.seqs})
            st.context_requests = len({request_id for request_id, _ in prefill})
            st.generation_requests = len({seq.request_id for seq, p in zip(batch.seqs, batch.prefill) if not p})
            st.context_tokens = sum(n for _, n in prefill)
            st.kv_blocks_used, st.kv_blocks_free = bm.num_used_blocks, bm.num_free_blocks
            st.preemptions = self.scheduler.num_preemptions
            st.eager_iterations = self.runner.eager_steps
            for name, value in self.lora.stats().items():
                setattr(st, name, value)
            if self.speculator is not None:
                c = self.speculator.counters
                st.spec_draft_tokens, st.spec_accepted_tokens, st.spec_steps = c.draft_tokens, c.accepted_tokens, c.steps
        with self._cond:
            self._num_waiting = waiting

