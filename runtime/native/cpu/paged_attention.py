"""Decode attention on CPU through our C++ kernel (paged_decode_attention.cpp): it reads each sequence's K/V
where the paged cache holds them.

Why: the reference backend (runtime/native/models/attention.py) gathers every row's blocks into a padded copy, then
runs SDPA over it with a mask. At 16 streams of SmolLM2 that copy and the padded SDPA were 22 of a 69 ms step
(benchmarks/RESULTS.md). The kernel is built once by torch's C++ extension loader at start-up (a C++ compiler
is needed; about 10 s the first time, then loaded from torch's extension cache). Without a compiler the
reference backend serves, with a warning. Decode steps use it, eager or compiled (runtime/native/cpu/compiled_decode.py);
prefill, chunked prefill and speculative scoring steps keep the reference backend.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from runtime.native.attention_metadata import AttentionMetadata
from runtime.native.models.attention import (
    register_attention_backend,
    torch_paged_attention,
    write_kv,
)
from runtime.native.models.kv_scales import FP8, UNIT, KvScales

logger = logging.getLogger(__name__)
# one extension: the decode-attention kernel, the int4/int8 products and the whole decode step, which calls both,
# compiled as the one unit that includes them all (_UNIT: torch's headers read once)
_UNIT = Path(__file__).with_name("cpu_kernels.cpp")
_SOURCES = [_UNIT, *(Path(__file__).with_name(name) for name in
                     ("paged_decode_attention.cpp", "quantized_linear.cpp", "decode_step.cpp", "spread.cpp"))]
_HEADER = Path(__file__).with_name("cpu_kernels.h")


@contextlib.contextmanager
def one_loader(build_dir: Path) -> Iterator[None]:
    """Hold `build_dir` for one extension loader at a time, after removing a build lock that a killed loader left.

    torch's extension loader waits for its lock file without a time limit, so a server killed while building the
    kernel (Ctrl-C during the first start) made every later start wait there (10 minutes, when the lock was judged by
    its age). An flock is released by the kernel when its holder dies: under it, no other loader is alive, so a lock
    file found then is a dead loader's."""
    with open(build_dir / "loader.flock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        lock = build_dir / "lock"
        if lock.exists():
            logger.warning("CPU: removing the kernel build lock of a process that did not finish (%s)", lock)
            lock.unlink(missing_ok=True)
        yield


def _kernel_loaded() -> bool:
    """Whether this process holds the kernels' ops already: loading their library again (torch builds a renamed copy
    when its build arguments differ) registers them twice, which aborts the process."""
    return hasattr(torch.ops.trtllm_gateway_cpu, "paged_decode_attention")


@functools.cache
def build_kernel() -> bool:
    """Build the kernel, or load it from torch's extension cache; False, with a warning, where that fails."""
    from torch.utils import cpp_extension

    if _kernel_loaded():
        return True
    started = time.perf_counter()
    logger.info("CPU: building the paged decode-attention kernel (cached after the first start)")
    name = "trtllm_gateway_cpu"
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root())
    # our own folder, so that its lock is known; one per Python and torch build, as torch's default folders are, and
    # per source and its place: two checkouts never rebuild over each other's (ninja rebuilds everything when the
    # sources' paths in its build file change, even for the same code)
    source = hashlib.sha256(b"".join(p.read_bytes() for p in (*_SOURCES, _HEADER))
                            + str(_HEADER.parent).encode()).hexdigest()[:12]
    build_dir = root / f"{name}-py{sys.version_info.major}{sys.version_info.minor}-torch{torch.__version__}-{source}"
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
        with one_loader(build_dir):
            cpp_extension.load(name=name, sources=[str(_UNIT)], is_python_module=False,
                               extra_cflags=["-O3", "-march=native"], build_directory=str(build_dir))
    except Exception as exc:  # noqa: BLE001 - any failure to build leaves the reference backend serving
        logger.warning("CPU: no paged decode-attention kernel (%s: %s); decode attention gathers the cache instead",
                       type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        return False
    # output shapes for torch.compile, which calls them from a compiled one-row step (runtime/native/cpu/compiled_decode.py)
    torch.library.register_fake("trtllm_gateway_cpu::paged_decode_attention")(
        lambda q, kv_cache, block_tables, seq_lens, window, sinks: torch.empty_like(q))
    torch.library.register_fake("trtllm_gateway_cpu::int4_linear")(
        lambda x, packed, scale, offset, out_features: x.new_empty((x.shape[0], out_features)))
    torch.library.register_fake("trtllm_gateway_cpu::int8_linear")(
        lambda x, tiled, scale, out_features: x.new_empty((x.shape[0], out_features)))
    logger.info("CPU: paged decode-attention kernel ready in %.1f s", time.perf_counter() - started)
    return True


def cpu_paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor | None,
    meta: AttentionMetadata,
    scale: float,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
    kv_scales: KvScales = UNIT,
) -> torch.Tensor:
    """The kernel for decode-only steps of 16- and 32-bit caches; the reference backend for everything else."""
    if kv_cache is None or not meta.is_decode_only or not kernel_fits(q, k) or kv_cache.dtype == FP8:
        return torch_paged_attention(q, k, v, kv_cache, meta, scale, window, sinks, kv_scales)
    write_kv(k, v, kv_cache, meta.slot_mapping)
    out = torch.ops.trtllm_gateway_cpu.paged_decode_attention(  # (a compiled step's lengths are int64)
        (q.float() * scale).contiguous(), kv_cache, meta.block_tables.contiguous(),
        meta.seq_lens.to(torch.int32).contiguous(), window or 0, None if sinks is None else sinks.float().contiguous())
    return out.to(q.dtype)


def kernel_fits(q: torch.Tensor, k: torch.Tensor) -> bool:
    """The kernel's shapes: a head size that is a multiple of 16 up to 256, up to 16 query heads per KV head."""
    head_dim = q.shape[-1]
    return head_dim % 16 == 0 and head_dim <= 256 and q.shape[1] // k.shape[1] <= 16


def use_cpu_kernels(enabled: bool) -> bool:
    """Route CPU decode attention through the kernel (built first), or back to the reference backend; whether
    the kernel serves. The choice is process-wide, as the attention backends are."""
    enabled = enabled and build_kernel()
    register_attention_backend("cpu", cpu_paged_attention if enabled else torch_paged_attention)
    return enabled
