"""benchmarks/decode_b1.py in seconds: one stream through the engine core on a tiny random model (CPU)."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.smoke import output_of, positive, run_module

pytestmark = pytest.mark.benchmark_smoke


def test_one_stream_reports_its_gap() -> None:
    proc = run_module("decode_b1", "--smoke", timeout=240)
    assert proc.returncode == 0, output_of(proc)
    result = json.loads(proc.stdout.splitlines()[-1])
    assert positive(result["itl_ms_p50"]) and result["tokens"] >= 16
