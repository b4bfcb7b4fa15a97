"""benchmarks/request_pickup.py in seconds: both ways measured, every request picked up."""

from __future__ import annotations

import json

import pytest

from benchmarks import request_pickup
from tests.benchmarks.smoke import positive

pytestmark = pytest.mark.benchmark_smoke


def test_both_ways_are_measured(capsys: pytest.CaptureFixture[str]) -> None:
    request_pickup.main(["--requests", "3", "--rounds", "1", "--pause-ms", "5"])
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert positive(*result["back_to_back_pickup_ms"], *result["after_5_ms_pickup_ms"])
