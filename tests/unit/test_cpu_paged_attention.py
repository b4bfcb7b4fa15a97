"""runtime/native/cpu/paged_attention.py: the C++ decode-attention kernel reads the paged cache where it lies and gives
exact attention; an engine serving with it decodes transformers' greedy tokens; without a compiler the reference
backend serves."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from benchmarks.cpu_attention import decode_step
from runtime.native.attention_metadata import AttentionMetadata
from runtime.native.cpu import paged_attention
from runtime.native.cpu.paged_attention import (
    build_kernel,
    cpu_paged_attention,
    one_loader,
    use_cpu_kernels,
)
from runtime.native.models import attention
from runtime.native.models.attention import torch_paged_attention
from tests.engine_harness import collect, hf_greedy, load_hf, request, running_engine
from tests.tiny_models import build_tiny_model

LENGTHS = [1, 15, 16, 17, 100, 33]  # within, at and across block boundaries


@pytest.fixture(scope="module", autouse=True)
def kernel() -> None:
    assert build_kernel(), "the C++ kernel did not build"
    yield
    use_cpu_kernels(False)  # later tests in this process get the reference backend, as the suite configures


def exact_attention(q: torch.Tensor, cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                    window: int | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Float64 attention of each row over its first seq_len cached tokens (the last `window` of them), with
    `sinks` [H] as one more logit of each head's softmax."""
    out = []
    for b, n in enumerate(meta.seq_lens_host):
        block = meta.block_size
        first = 0 if window is None else max(0, n - window)
        slots = [int(meta.block_tables[b, t // block]) * block + t % block for t in range(first, n)]
        keys, values = (cache[i].flatten(0, 1)[slots].double() for i in (0, 1))  # [n, Hkv, D]
        group = q.shape[1] // keys.shape[1]
        keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
        logits = torch.einsum("hd,thd->ht", q[b].double() * scale, keys)
        if sinks is not None:
            logits = torch.cat((logits, sinks.double()[:, None]), dim=1)
        weights = torch.softmax(logits, dim=-1)[:, : len(slots)]
        out.append(torch.einsum("ht,thd->hd", weights, values))
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (8, 2, 32), (8, 2, 128), (6, 2, 48), (4, 4, 16)])
def test_kernel_gives_exact_attention_and_writes_the_cache(heads: int, kv_heads: int, head_dim: int,
                                                           dtype: torch.dtype) -> None:
    """Every compiled shape (SmolLM2 64/3, the demo 32/4, 128/4) and the generic path; the new K/V land in the
    same slots as the reference backend's."""
    q, k, v, cache, meta = decode_step(LENGTHS, heads, kv_heads, head_dim, dtype)
    reference_cache = cache.clone()
    scale = head_dim**-0.5
    reference = torch_paged_attention(q, k, v, reference_cache, meta, scale)
    out = cpu_paged_attention(q, k, v, cache, meta, scale)
    assert torch.equal(cache, reference_cache)
    exact = exact_attention(q, cache, meta, scale)
    # float32 throughout, so within float32 rounding; the low-precision outputs are one rounding of the float32 result
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
    assert out.dtype == dtype and torch.allclose(out.double(), exact, atol=tolerance, rtol=0)
    assert (out.double() - exact).abs().max() <= (reference.double() - exact).abs().max() + tolerance / 8


@pytest.mark.parametrize("window,with_sinks", [(16, False), (5, True), (None, True), (200, False)])
def test_sliding_window_and_sinks_give_exact_attention(window: int | None, with_sinks: bool) -> None:
    """A window reads only each row's last `window` keys (16: one block's worth at block size 16, 5: inside a block,
    200: longer than every row); sinks join each head's softmax. The reference backend agrees."""
    q, k, v, cache, meta = decode_step(LENGTHS, 8, 2, 32, torch.float32)
    sinks = torch.randn(8, generator=torch.Generator().manual_seed(3)) if with_sinks else None
    reference_cache = cache.clone()
    reference = torch_paged_attention(q, k, v, reference_cache, meta, 0.2, window, sinks)
    out = cpu_paged_attention(q, k, v, cache, meta, 0.2, window, sinks)
    exact = exact_attention(q, cache, meta, 0.2, window, sinks)
    assert torch.allclose(out.double(), exact, atol=1e-5, rtol=0)
    assert torch.allclose(reference.double(), exact, atol=1e-5, rtol=0)
    if window is not None and window < max(LENGTHS):
        assert not torch.allclose(out.double(), exact_attention(q, cache, meta, 0.2, None, sinks), atol=1e-3)


def test_shapes_the_kernel_does_not_take_use_the_reference() -> None:
    q, k, v, cache, meta = decode_step(LENGTHS, 4, 2, 20, torch.float32)  # a head size that is not a multiple of 16
    expected = torch_paged_attention(q, k, v, cache.clone(), meta, 0.2)
    assert torch.equal(cpu_paged_attention(q, k, v, cache, meta, 0.2), expected)


def test_without_a_compiler_the_reference_serves_with_a_warning(monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    from torch.utils import cpp_extension

    def no_compiler(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Error building extension 'trtllm_gateway_cpu': c++: not found")

    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    monkeypatch.setattr(paged_attention, "_kernel_loaded", lambda: False)  # as in a process that never built it
    build_kernel.cache_clear()
    try:
        with caplog.at_level(logging.WARNING):
            assert use_cpu_kernels(True) is False
        assert attention._BACKENDS["cpu"] is torch_paged_attention
        assert "no paged decode-attention kernel (RuntimeError: Error building extension" in caplog.text
    finally:
        monkeypatch.undo()
        build_kernel.cache_clear()
        assert build_kernel()  # loads the library built before


async def test_an_engine_with_the_kernel_decodes_transformers_tokens(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Three streams at once (decode steps of three rows) across block boundaries, float32, greedy."""
    checkpoint = build_tiny_model(tmp_path, "llama")  # head size 16, two query heads per KV head: the generic path
    served = []
    fits = paged_attention.kernel_fits
    monkeypatch.setattr(paged_attention, "kernel_fits", lambda q, k: served.append(q.shape[0]) or fits(q, k))
    prompts = [[5, 9, 17], list(range(3, 9)), list(range(3, 14))]
    async with running_engine(checkpoint, kv_block_size=4, cpu_compile=True) as engine:
        outputs = await asyncio.gather(*(collect(engine, request(f"r{i}", p, max_tokens=12))
                                         for i, p in enumerate(prompts)))
    assert 3 in served, "no three-row decode step went through the kernel"
    hf = load_hf(checkpoint)
    assert [out.tokens[0] for out in outputs] == [hf_greedy(hf, p, 12) for p in prompts]


def test_a_build_lock_left_by_a_killed_loader_is_removed_at_once_and_a_live_loader_waited_for(tmp_path) -> None:
    """torch waits for the extension's build lock without a time limit. A loader holds an flock while it builds,
    which the kernel releases when it dies: the next one waits while it lives, then removes the lock it left."""
    holder = ("import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
              "open(sys.argv[2], 'w').close(); print('held', flush=True); time.sleep(60)")
    lock = tmp_path / "lock"
    proc = subprocess.Popen([sys.executable, "-c", holder, str(tmp_path / "loader.flock"), str(lock)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"  # a loader building, lock taken
        entered = threading.Event()

        def load() -> None:
            with one_loader(tmp_path):
                entered.set()
        waiter = threading.Thread(target=load)
        waiter.start()
        assert not entered.wait(0.5) and lock.exists()  # a live loader's lock is waited for, not removed
        proc.kill()  # killed mid-build: its lock file stays behind
        proc.wait()
        assert entered.wait(10) and not lock.exists()
        waiter.join()
    finally:
        proc.kill()
        proc.wait()


def test_the_package_ships_every_file_the_kernel_build_reads() -> None:
    """An installed wheel (pip install, not -e) holds the sources and the header that build_kernel hashes and
    compiles: the header was left out of the package data, and a start from such an install failed reading it."""
    tomllib = pytest.importorskip("tomllib")
    from fnmatch import fnmatch

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    shipped = pyproject["tool"]["setuptools"]["package-data"]["runtime.native.cpu"]
    for needed in (*paged_attention._SOURCES, paged_attention._HEADER):
        assert any(fnmatch(needed.name, pattern) for pattern in shipped), f"{needed.name} is not in the package"
