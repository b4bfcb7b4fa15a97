"""benchmarks/soak.py for 1 s (half of it warm-up) at concurrency 2 (its own gateway process on the demo model). Only
the requests are checked, not the exit code: its resident-memory verdict means nothing over 1 s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import soak
from tests.benchmarks.smoke import positive

pytestmark = pytest.mark.benchmark_smoke


# the gateway it starts runs the engine in the gateway's process (TRTLLM_GATEWAY_ENGINE_PROCESS=false): the script runs
# the same, without a second torch process to start (3-4 s here); the engine-core process is served in tests/e2e
def test_mixed_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "soak.json"
    monkeypatch.setenv("TRTLLM_GATEWAY_ENGINE_PROCESS", "false")
    soak.main(["--duration", "1", "--warmup", "0.5", "--concurrency", "2", "--json", str(out)])  # in this process
    assert out.exists()
    result = json.loads(out.read_text())
    assert result["errors"] == {} and result["server_5xx"] == 0, result
    assert positive(result["requests"], result["output_tokens"], result["rss_end_mb"])
