"""benchmarks/few_token_step.py in seconds on the CPU (--smoke, in this process: the tiny shape op by op; timings
mean nothing here): each row count is timed both ways and the table is written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks import few_token_step
from tests.benchmarks.smoke import positive

pytestmark = pytest.mark.benchmark_smoke


def test_each_row_count_is_timed_through_gemvs_and_cublas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["few_token_step", "--smoke", "--rows", "1", "3", "--context", "20",
                                      "--work", str(tmp_path / "w"), "--out", str(tmp_path)])
    few_token_step.main()
    result = json.loads((tmp_path / "few_token_step.json").read_text())
    assert list(result["gemv_ms"]) == list(result["cublas_ms"]) == ["1", "3"]
    assert positive(*result["gemv_ms"].values(), *result["cublas_ms"].values())
