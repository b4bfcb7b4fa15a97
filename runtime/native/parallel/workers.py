"""Rank 0's side of tensor parallelism: it starts a worker process per other rank, joins their group, and tells them
each model call (runtime/native/parallel/messages.py); the model runner calls it around its own.

A worker that dies takes the engine with it: `on_failure` is told at once (the engine's step loop then dies, failing
every request; the engine-core process exits non-zero) and the workers left are killed when the engine stops. The
workers die with rank 0's process too (runtime/process/parent.py).
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable

import msgspec
import numpy as np
import torch
import torch.distributed as dist

from runtime.config import EngineConfig
from runtime.native.lora.weights import LoraWeights
from runtime.native.parallel import group as tp_group
from runtime.native.parallel.messages import (
    HOST,
    IDLE_TIMEOUT,
    AllocateCache,
    CaptureGraphs,
    CopyBlocks,
    Forward,
    GraphStep,
    HostStep,
    Logits,
    Profile,
    Sampled,
    SlotChange,
    Stop,
    WorkerArgs,
    broadcast,
    join_group,
    joining_key,
)
from runtime.process.launcher import Child, launch

logger = logging.getLogger(__name__)

STOP_GRACE = 10.0  # s a worker may take to exit after Stop before it is killed
JOIN_POLL = 0.05  # s between looks at the workers while they start (or after a failed step)
EXPLAIN_WAIT = 1.0  # s a failed step waits for a worker's exit to explain it


def rank_device(device: torch.device, rank: int) -> torch.device:
    """The device of `rank`: the GPU `rank` places after rank 0's (cuda:0 unless --device names another); the CPU."""
    if device.type != "cuda":
        return device
    return torch.device("cuda", (device.index or 0) + rank)


class Workers:
    """The worker processes of ranks 1..size-1 and the messages to them (see the module docstring)."""

    def __init__(self, config: EngineConfig, device: torch.device, on_failure: Callable[[str], None]) -> None:
        size = config.tensor_parallel_size
        if device.type == "cuda" and (device.index or 0) + size > torch.cuda.device_count():
            raise ValueError(f"--tensor-parallel-size {size} needs {size} GPUs from {device}; "
                             f"{torch.cuda.device_count()} are visible")
        self.size = size
        self._device = device
        self._on_failure = on_failure
        self._stopping = False
        self.failure: str | None = None
        self._lora_changes: list[SlotChange] = []  # since the last Forward (appended from any thread)
        self._lora_lock = threading.Lock()
        store = dist.TCPStore(HOST, 0, size, is_master=True, timeout=IDLE_TIMEOUT, wait_for_workers=False)
        self._procs: list[Child] = []
        try:
            for rank in range(1, size):
                self._start(WorkerArgs(config, rank, size, store.port, str(rank_device(device, rank)), os.getpid()))
            self._wait_until_joining(store)
            tp, self._control = join_group(0, size, store, rank_device(device, 0))
        except BaseException:
            self._stopping = True
            self._end_workers(0.0)
            raise
        tp_group.use(tp)
        self._tp = tp

    def _start(self, args: WorkerArgs) -> None:
        proc = launch(f"tp-worker-{args.rank}", "runtime.native.parallel.worker:run", msgspec.msgpack.encode(args))
        self._procs.append(proc)
        threading.Thread(target=self._watch, args=(args.rank, proc), name=f"tp-worker-{args.rank}", daemon=True).start()

    def _wait_until_joining(self, store: dist.Store) -> None:
        """Until every worker is about to join the group (it marks `joining_key` in the store): a worker that
        exits before is an error here, not a group that waits for it without end."""
        for rank, proc in enumerate(self._procs, start=1):
            while not store.check([joining_key(rank)]):
                if proc.poll() is not None:
                    raise RuntimeError(f"tensor-parallel worker {rank} exited with code {proc.returncode} before "
                                       "joining (its log says why)")
                time.sleep(JOIN_POLL)

    def _end_workers(self, grace: float) -> None:
        """Wait up to `grace` s for each worker to exit, then kill it."""
        for proc in self._procs:
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _watch(self, rank: int, proc: Child) -> None:
        proc.wait()
        if self._stopping:
            return
        self.failure = _exited(rank, proc)
        logger.error("%s; the engine stops", self.failure)
        self._on_failure(self.failure)

    def explain(self, exc: Exception, wait: float = EXPLAIN_WAIT) -> None:
        """Raise `exc`'s cause when it is a worker that died (a collective with it fails as its connection closes,
        just before its exit is seen): waits up to `wait` s for one to have exited; returns otherwise."""
        deadline = time.monotonic() + wait
        while True:
            for rank, proc in enumerate(self._procs, start=1):
                if proc.poll() is not None:
                    raise RuntimeError(_exited(rank, proc)) from exc
            if time.monotonic() > deadline:
                return
            time.sleep(JOIN_POLL)

    def _send(self, message: object) -> None:
        if self.failure is not None:
            raise RuntimeError(self.failure)
        broadcast(message, self._control)

    # ---- the model runner's calls, each before its own ------------------------------------------
    def forward(self, step: HostStep, prev_samples: list[int], adapter_slots: list[int]) -> None:
        self._send(Forward(step, prev_samples, adapter_slots, self._take_lora_changes()))

    def graph_step(self, columns: np.ndarray, tables: np.ndarray) -> None:
        self._send(GraphStep(columns, tables, self._take_lora_changes()))

    def _take_lora_changes(self) -> list[SlotChange]:
        with self._lora_lock:
            changes, self._lora_changes = self._lora_changes, []
        return changes

    def lora_changed(self, slot: int, key: int | None, weights: LoraWeights | None) -> None:
        """A LoRA slot was placed or emptied on rank 0 (DeviceSlots.on_change): the other ranks follow before the next
        step (whichever thread changed it: the messages themselves go out from the step thread only)."""
        with self._lora_lock:
            self._lora_changes.append((slot, key, weights))

    def logits(self, rows: list[int]) -> None:
        self._send(Logits(rows))

    def share_sampled(self, token_ids: torch.Tensor) -> None:
        """The step's sampled ids (long [count], on the device) to every rank, after the sampler ran."""
        self._send(Sampled(token_ids.shape[0]))
        dist.broadcast(token_ids, src=0, group=self._tp.group)

    def capture_graphs(self, max_rows: int, max_blocks_per_seq: int) -> None:
        self._send(CaptureGraphs(max_rows, max_blocks_per_seq))

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        self._send(CopyBlocks(copies))

    def profile(self, max_num_tokens: int, max_batch_size: int, context_window: int) -> None:
        self._send(Profile(max_num_tokens, max_batch_size, context_window))

    def allocate_cache(self, num_blocks: int, dtype: torch.dtype | None = None) -> None:
        self._send(AllocateCache(num_blocks, dtype))

    def stop(self) -> None:
        """Stop the workers (killing those that do not exit) and leave the group; the model cannot run after."""
        self._stopping = True
        if self.failure is None:
            try:
                broadcast(Stop(), self._control)
            except Exception:  # a worker gone already: killed below
                logger.exception("could not tell the tensor-parallel workers to stop")
        self._end_workers(STOP_GRACE if self.failure is None else 0.0)  # (after a failure the others wait in vain)
        if self.failure is None or self._device.type == "cpu":  # (NCCL may hang on a group with a dead rank)
            dist.destroy_process_group()
        tp_group.use(tp_group.TensorParallel())


def _exited(rank: int, proc: Child) -> str:
    return f"tensor-parallel worker {rank} (pid {proc.pid}) exited with code {proc.returncode}"
