"""benchmarks/front_end_lag.py in seconds: an EngineClient beside the synthetic core, both lag figures."""

from __future__ import annotations

import json

import pytest

from benchmarks import front_end_lag
from tests.benchmarks.smoke import positive

pytestmark = pytest.mark.benchmark_smoke


def test_streams_get_every_token_and_both_lags_are_measured(capsys: pytest.CaptureFixture[str]) -> None:
    # in this process (its synthetic core still in its own): a Python start with torch fewer
    front_end_lag.main(["--streams", "4", "--seconds", "1", "--step-ms", "5", "--output", "16"])
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert positive(result["closed_loop_4_tok_s"], result["event_loop_lag_ms_p99"], result["event_loop_delay_ms_p99"])
