"""benchmarks/decode_b1.py in seconds: one stream on a tiny random model (CPU), through the engine core and
in-process with host timers."""

from __future__ import annotations

import json

import pytest

from benchmarks import decode_b1
from tests.benchmarks.smoke import positive

pytestmark = pytest.mark.benchmark_smoke


def test_one_stream_reports_its_gap(capsys: pytest.CaptureFixture[str]) -> None:
    decode_b1.main(["--smoke"])  # in this process: a Python start with torch fewer (seconds here)
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert positive(result["itl_ms_p50"]) and result["tokens"] >= 16


def test_timers_cover_every_step(capsys: pytest.CaptureFixture[str]) -> None:
    decode_b1.main(["--smoke", "--timers"])
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    parts = result["host_us_per_step"]
    assert result["steps"] >= 16
    for name in ("NativeEngine.step", "EngineCore.step", "Scheduler.schedule", "Scheduler.update_from_output",
                 "ModelRunner.launch", "Sampler.__call__", "Outbox.put"):
        assert parts[name]["calls_per_step"] >= 1.0 and positive(parts[name]["us_per_step"]), name


def test_streams_decode_together(capsys: pytest.CaptureFixture[str]) -> None:
    """--streams: that many requests at once, each step's rows; the timers per step as before."""
    decode_b1.main(["--smoke", "--timers", "--streams", "4"])
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert result["streams"] == 4 and result["tokens"] >= 4 * 16
    assert result["host_us_per_step"]["Scheduler.update_from_output"]["calls_per_step"] >= 1.0
