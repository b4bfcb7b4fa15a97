"""benchmarks/startup.py on the demo model (the engine in the server's process: one torch process to start)."""

from __future__ import annotations

import json

import pytest

from benchmarks import startup
from tests.benchmarks.smoke import positive

pytestmark = pytest.mark.benchmark_smoke


def test_a_start_reports_the_port_readiness_and_its_phases(capsys: pytest.CaptureFixture[str]) -> None:
    assert startup.main(["--timeout", "300", "--", "--model", "demo", "--no-engine-process"]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert 0 < result["port_open_s"] <= result["ready_s"] <= result["settled_s"]
    assert positive(result["cpu_s_at_ready"]) and result["cpu_s_at_settled"] >= result["cpu_s_at_ready"]
    logged = [line.split(":")[0] for line in result["start_up_log"]]
    assert "loading the tokenizer" in logged and "loading the weights" in logged
    assert len(result["rss_mb"]) == 1 and positive(*result["rss_mb"].values())  # the one process, after a request
