"""benchmarks/http_vs_core.py in seconds: the gateway (one front end, whose /metrics give its own time to first
token) against an engine core driven from two consumer processes, in interleaved rounds, on a tiny random model
(CPU), with output lengths that vary. Several front ends (--api-servers) are tests/e2e/test_api_servers.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import http_vs_core
from tests.benchmarks.smoke import positive

pytestmark = pytest.mark.benchmark_smoke


def test_rounds_alternate_and_give_ratios(tmp_path, smoke_work: Path, load_generator_here: None,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    # the script and its load generator in this process (the servers in theirs): four Python starts with torch fewer
    assert http_vs_core.main(["--smoke", "--consumers", "2", "--output-std", "2",
                              "--out", str(tmp_path), "--work", str(smoke_work)]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert len(result["rounds"]) == 2
    sides = [[key for key in r if key in ("core_tok_s", "http_tok_s")] for r in result["rounds"]]
    assert sides == [["core_tok_s", "http_tok_s"], ["http_tok_s", "core_tok_s"]]  # ABBA: core first, then HTTP first
    for r in result["rounds"]:
        assert positive(r["core_tok_s"], r["http_tok_s"], r["front_end_cpu_busy_peak"], r["core_ttft_ms_p50"],
                        r["core_tpot_ms_p50"], r["http_tpot_ms_p50"], r["core_e2e_ms_p50"], r["http_e2e_ms_p50"],
                        r["core_gap_ms_p50"], r["http_gap_ms_p50"], r["server_ttft_ms_mean"]) \
            and r["ratio"] == r["http_tok_s"] / r["core_tok_s"]
        for side in ("core", "http"):  # the CPU's steps run op by op (the smoke model compiles none)
            assert r[f"{side}_eager_steps"] == r[f"{side}_steps"] > 0
    assert result["output_std"] == 2 and (tmp_path / "http-vs-core-8-api1-std2.json").exists()
