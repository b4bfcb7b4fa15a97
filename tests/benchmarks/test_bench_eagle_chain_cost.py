"""benchmarks/eagle_chain_cost.py in seconds on the CPU (--smoke, in this process: a child's start would cost more
than the run): every length and number of drafts gives its times, and the kernel tables come out (timings mean
nothing here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks import eagle_chain_cost
from tests.benchmarks.smoke import positive

pytestmark = pytest.mark.benchmark_smoke


def test_every_length_and_draft_count_is_timed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["eagle_chain_cost", "--smoke", "--device", "cpu", "--capacity", "1024",
                                      "--lengths", "100", "700", "--drafts", "1", "2", "--work", str(tmp_path / "w"),
                                      "--out", str(tmp_path)])
    eagle_chain_cost.main()
    result = json.loads((tmp_path / "eagle_chain_cost.json").read_text())
    assert list(result["proposals"]) == ["100x1", "100x2", "700x1", "700x2"]
    assert positive(*(p["host_us"] for p in result["proposals"].values()))
    assert list(result["kernels"]) == ["256", "1024"] and all(result["kernels"].values())
