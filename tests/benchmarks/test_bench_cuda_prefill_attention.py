"""benchmarks/cuda_prefill_attention.py in seconds: every setting runs and keeps the sampled rows' bits equal to the
decode kernel's (Triton's interpreter on a CPU-only box)."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.smoke import output_of, run_module

pytestmark = pytest.mark.benchmark_smoke
pytest.importorskip("triton")


def test_every_setting_runs_and_keeps_the_decode_kernels_bits() -> None:
    proc = run_module("cuda_prefill_attention", "--smoke", "--block-m", "16,32", "--num-warps", "4",
                      "--num-stages", "2", timeout=240)
    assert proc.returncode == 0, output_of(proc)
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["block_m"] for r in rows] == [16, 32]
    assert all(r["same_bits_as_decode"] for r in rows)
