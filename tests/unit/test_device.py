"""CPU thread count of the native runtime: configured, else $OMP_NUM_THREADS, else all cores but one."""

from __future__ import annotations

import threading

import pytest
import torch

import runtime.native.device as device
from runtime.native.device import cpu_thread_count
from tests.engine_harness import running_engine
from tests.tiny_models import build_tiny_model


def test_configured_count_wins_and_must_be_positive(monkeypatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpu_thread_count(5) == 5
    with pytest.raises(ValueError, match="cpu_threads must be at least 1"):
        cpu_thread_count(0)


def test_omp_num_threads_then_all_cores_but_one(monkeypatch) -> None:
    monkeypatch.setattr(device.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert cpu_thread_count(None) == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "not a number")
    assert cpu_thread_count(None) == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert cpu_thread_count(None) == 3
    monkeypatch.setattr(device.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert cpu_thread_count(None) == 1  # never zero


def _threads_of_a_new_thread() -> int:
    """What a thread started now (as the engine's step thread is) runs its matmuls with."""
    seen: list[int] = []
    thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    return seen[0]


async def test_the_engine_sets_the_threads_its_step_thread_runs_with(tmp_path) -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        async with running_engine(build_tiny_model(tmp_path, "llama"), cpu_threads=1):
            assert _threads_of_a_new_thread() == 1
    finally:
        torch.set_num_threads(before)
