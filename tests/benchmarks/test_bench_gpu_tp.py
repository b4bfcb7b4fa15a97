"""benchmarks/gpu_tp.py in seconds on the CPU: the tiny shape at tensor parallel size 1 and 2 (gloo; no CUDA graphs on
the CPU), every figure written (timings mean nothing here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import gpu_tp
from tests.benchmarks.smoke import positive

pytestmark = pytest.mark.benchmark_smoke


def test_every_engine_runs_and_writes_its_figures(tmp_path: Path) -> None:
    # in this process (a Python start with torch fewer; tests/conftest.py turns the CPU's compiled steps off)
    assert gpu_tp.main(["--smoke", "--device", "cpu", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"),
                        "--engines", "tp1,tp2"]) == 0
    result = json.loads((tmp_path / "out" / "gpu_tp.json").read_text())
    for label in ("tp1", "tp2"):
        assert positive(result[label]["load_s"], result[label]["decode_b1_itl_ms_p50"],
                        result[label]["throughput_8_tok_s"]), result[label]
    for window in ("collectives_b1", "collectives_batch"):
        figures = result["tp2"][window]
        assert figures["steps"] > 0 and positive(figures["all_reduce_us_per_step"], figures["all_gather_us_per_step"])
    ratios = result["tp2_vs_tp1"]
    assert positive(ratios["decode_b1_time_ratio"], ratios["throughput_ratio"])
    assert (tmp_path / "out" / "tp2_trace_b1.json").exists()
