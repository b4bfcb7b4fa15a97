"""benchmarks/grpc_vs_http.py: the gateway (its own process) on the tiny model, both Triton streaming transports at
one concurrency, one repeat; the load generator runs in this process (conftest.load_generator_here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import grpc_vs_http
from tests.benchmarks.smoke import positive

pytestmark = pytest.mark.benchmark_smoke


# the gateway it starts runs the engine in the gateway's process (TRTLLM_GATEWAY_ENGINE_PROCESS=false): the script runs
# the same, without a second torch process to start (3-4 s here); the engine-core process is served in tests/e2e
def test_both_transports_table_plot_and_section(tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                load_generator_here: None) -> None:
    monkeypatch.setattr(grpc_vs_http, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(grpc_vs_http, "RESULTS_MD", tmp_path / "RESULTS.md")
    monkeypatch.setenv("TRTLLM_GATEWAY_ENGINE_PROCESS", "false")
    code = grpc_vs_http.main(["--model", str(tiny_model), "--tokenizer", str(tiny_model), "--concurrency", "2",
                              "--repeat", "1", "--duration", "0.3", "--input-tokens", "8", "--output-tokens", "4",
                              "--append-results"])
    assert code == 0
    (js,), (png,) = tmp_path.glob("grpc-vs-http-*.json"), tmp_path.glob("grpc-vs-http-*.png")
    runs = json.loads(js.read_text())["runs"]
    for label in grpc_vs_http.TRANSPORTS:
        (point,) = runs[label]["2"]
        # tokens are counted as text-carrying events (Triton reports no usage): a random model's token may carry none
        assert point["failed"] == 0 and 0 < point["mean_output_tokens"] <= 4, point
        assert positive(point["output_token_throughput"], point["ttft_ms"]["p50"])
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "| 2 |" in (tmp_path / "RESULTS.md").read_text()
