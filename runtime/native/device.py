"""Where the native runtime runs and in which dtype (EngineConfig.device / .dtype resolution).

device "auto": the first CUDA device when one is available, else the CPU.
dtype "auto":
  CUDA  the checkpoint's dtype when it is bfloat16 or float16; a float32 checkpoint runs in bfloat16
        (float16 on GPUs without bfloat16 support), as serving in float32 wastes half the memory;
  CPU   bfloat16 when the checkpoint is bfloat16 (halves memory; recent CPUs have bf16 matmuls),
        otherwise float32 (float16 matmuls are slow or missing on CPUs).
CPU threads (`cpu_thread_count`): the configured number, else $OMP_NUM_THREADS, else every core the
process may use but one. The step thread's matmuls then leave a core to the event loop that parses
requests and streams tokens; torch's default (every core) made the demo model 1.3-1.5x slower on
a 2-core machine, at one stream and at 32 (benchmarks/RESULTS.md, 2026-11-23 17:35).
"""

from __future__ import annotations

import os

import torch

from runtime.config import DTYPE_NAMES

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_NAMES}


def resolve_device(name: str) -> torch.device:
    """torch.device for "auto" | "cpu" | "cuda" | "cuda:N"; ValueError when CUDA is asked for but absent."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was requested but CUDA is not available")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {name!r} (use auto, cpu, cuda or cuda:N)")
    return device


def resolve_dtype(name: str, device: torch.device, checkpoint_dtype: torch.dtype) -> torch.dtype:
    """torch dtype for "auto" | "bfloat16" | "float16" | "float32" (see the module docstring)."""
    if name != "auto":
        if name not in DTYPES:
            raise ValueError(f"unsupported dtype {name!r} (use auto, {', '.join(DTYPES)})")
        return DTYPES[name]
    if device.type == "cuda":
        if checkpoint_dtype in (torch.bfloat16, torch.float16):
            return checkpoint_dtype
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if checkpoint_dtype == torch.bfloat16 else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def cpu_thread_count(configured: int | None) -> int:
    """Intra-op threads for the native runtime on CPU (see the module docstring)."""
    if configured is not None:
        if configured < 1:
            raise ValueError(f"cpu_threads must be at least 1, got {configured}")
        return configured
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores - 1)


def host_tensor(values: list, dtype: torch.dtype | None, device: torch.device) -> torch.Tensor:
    """`values` as a tensor on `device`, copied without waiting for the device's queued work (to_device)."""
    return to_device(torch.tensor(values, dtype=dtype), device)


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor's copy on `device`, queued behind the device's work without the host waiting for it.

    A copy from ordinary (pageable) host memory may wait for the stream to drain first: with the engine's async
    scheduling the host then waits for the step it has only just launched (on the H200 a prefill's pageable
    input copy held the host 2.5 ms). From pinned memory the copy is asynchronous; torch's caching host
    allocator reuses a pinned block only once the copies that read it have run."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def record_now(event: torch.cuda.Event, on: torch.Tensor) -> None:
    """Record `event` on the current stream of the device holding `on`. `event.record()` finds that stream
    through a CUDA availability check that reads the environment: 1.2% of the engine core's step thread at 256
    rows (H200, py-spy), for its three events a step."""
    event.record(torch.cuda.current_stream(on.device))


class PinnedStaging:
    """Pinned host buffers of one shape for a device buffer's per-step inputs, used in turn: the host fills one
    while the copy from the other may still be queued (the engine launches step N+1 before step N has run).
    Cheaper than to_device's pinned copy of a fresh tensor (a pinned allocation per copy: 68 us a call under
    cProfile and torch.profiler on the H200)."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, count: int = 2) -> None:
        self._buffers = [torch.zeros(shape, dtype=dtype, pin_memory=True) for _ in range(count)]
        self._copied = [torch.cuda.Event() for _ in range(count)]  # recorded after each buffer's last copy
        self._turn = 0

    def take(self) -> torch.Tensor:
        """The next buffer to fill, once the last copy from it has run (it holds what was written then)."""
        self._copied[self._turn].synchronize()  # at once when never recorded
        return self._buffers[self._turn]

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Queue dst.copy_(src) for `src`, a contiguous part of the buffer `take` returned (as `dst` is of its
        device buffer: a strided copy would go through pageable memory); the next `take` gives the other buffer."""
        dst.copy_(src, non_blocking=True)
        record_now(self._copied[self._turn], dst)
        self._turn = (self._turn + 1) % len(self._buffers)
