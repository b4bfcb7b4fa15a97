"""benchmarks/cuda_decode_attention.py in seconds: every setting runs and equals the default's output (Triton's
interpreter on a CPU-only box)."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.smoke import output_of, run_module

pytestmark = pytest.mark.benchmark_smoke
pytest.importorskip("triton")


def test_every_setting_runs_and_agrees() -> None:
    proc = run_module("cuda_decode_attention", "--smoke", "--rows", "1,3", "--contexts", "40", "--block-n", "16,32",
                      "--num-warps", "4", timeout=240)
    assert proc.returncode == 0, output_of(proc)
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(r["rows"], r["block_n"]) for r in rows] == [(1, 16), (1, 32), (3, 16), (3, 32)]
    assert all(r["max_diff"] < 1e-5 for r in rows)
