"""benchmarks/serve.py (the load generator) against the gateway on the tiny model (in a thread here): each
dialect, and a sweep with its plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import serve
from tests.benchmarks.smoke import positive
from tests.e2e.conftest import RunningServer

pytestmark = pytest.mark.benchmark_smoke


def _argv(gateway: RunningServer, tiny_model: Path, *extra: str) -> list[str]:
    return ["--base-url", gateway.url, "--tokenizer", str(tiny_model), "--num-prompts", "4", "--input-mean", "8",
            "--input-std", "0", "--output-mean", "4", "--output-std", "0", "--warmup", "1", *extra]


@pytest.mark.parametrize("api", ["completions", "chat", "triton"])
def test_one_point_per_dialect(gateway: RunningServer, tiny_model: Path, tmp_path: Path, api: str) -> None:
    out = tmp_path / "serve.json"
    code = serve.main(_argv(gateway, tiny_model, "--api", api, "--num-requests", "6", "--concurrency", "2",
                            "--goodput", "e2e:60000", "--quiet", "--json", str(out)))
    assert code == 0
    result = json.loads(out.read_text())
    assert (result["api"], result["model"]) == (api, "tiny")  # the model as GET /v1/models lists it
    summary = result["points"][0]["summary"]
    assert (summary["completed"], summary["failed"]) == (6, 0), summary["errors"]
    assert positive(summary["output_token_throughput"], summary["request_throughput"], summary["ttft_ms"]["p50"],
                    summary["e2e_ms"]["p99"])


def test_sweep_writes_plot_and_json(gateway: RunningServer, tiny_model: Path, tmp_path: Path) -> None:
    code = serve.main(_argv(gateway, tiny_model, "--no-stream", "--num-requests", "4", "--sweep-concurrency", "1,2",
                            "--results-dir", str(tmp_path), "--label", "smoke", "--quiet"))
    assert code == 0
    (png,), (js,) = tmp_path.glob("smoke-*.png"), tmp_path.glob("smoke-*.json")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    points = json.loads(js.read_text())["points"]
    assert [p["concurrency"] for p in points] == [1, 2]
    assert all(p["summary"]["completed"] == 4 and p["summary"]["ttft_ms"] is None for p in points)  # not streamed



def test_client_processes_split_the_load_and_merge_the_results(gateway: RunningServer, tiny_model: Path,
                                                                tmp_path: Path) -> None:
    out = tmp_path / "serve.json"
    code = serve.main(_argv(gateway, tiny_model, "--api", "completions", "--num-requests", "7", "--concurrency", "3",
                            "--client-processes", "2", "--quiet", "--json", str(out)))
    assert code == 0
    summary = json.loads(out.read_text())["points"][0]["summary"]
    assert (summary["completed"], summary["failed"]) == (7, 0), summary["errors"]  # 4 + 3 requests
    assert summary["mean_output_tokens"] == 4.0 and positive(summary["client_cpu_s"], summary["ttft_ms"]["p50"])


def test_help_names_the_command_that_runs_it() -> None:
    """It once called itself `trtllm-gateway bench`, a command that does not exist."""
    text = serve.build_parser().format_help()
    assert text.startswith("usage: python -m benchmarks.serve ") and "trtllm-gateway bench" not in text
