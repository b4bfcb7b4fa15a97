"""benchmarks/front_end_lag.py in seconds: an EngineClient beside the synthetic core, both lag figures."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.smoke import output_of, positive, run_module

pytestmark = pytest.mark.benchmark_smoke


def test_streams_get_every_token_and_both_lags_are_measured() -> None:
    proc = run_module("front_end_lag", "--streams", "4", "--seconds", "1", "--step-ms", "5", "--output", "16")
    assert proc.returncode == 0, output_of(proc)
    result = json.loads(proc.stdout.splitlines()[-1])
    assert positive(result["closed_loop_4_tok_s"], result["event_loop_lag_ms_p99"], result["event_loop_delay_ms_p99"])
