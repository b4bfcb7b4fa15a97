"""benchmarks/hostile.py for 0.3 s per phase with one sender of lone surrogates (HTTP) and malformed messages
(gRPC), beside the prober of both transports (its own gateway process on the demo model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import hostile
from tests.benchmarks.smoke import positive

pytestmark = pytest.mark.benchmark_smoke


# the gateway it starts runs the engine in the gateway's process (TRTLLM_GATEWAY_ENGINE_PROCESS=false): the script runs
# the same, without a second torch process to start (3-4 s here); the engine-core process is served in tests/e2e
def test_lone_surrogates_and_malformed_grpc_messages_beside_the_prober(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "hostile.json"
    monkeypatch.setenv("TRTLLM_GATEWAY_ENGINE_PROCESS", "false")
    assert hostile.main(["--duration", "0.3", "--senders", "1", "--only", "lone_surrogate", "--only",
                         "grpc_malformed_stream", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["server_5xx"] == 0 and result["server_exited"] is False
    assert set(result["hostile_statuses"]) <= {"lone_surrogate 400", "grpc_malformed_stream OK (error response)"}, \
        result["hostile_statuses"]
    for phase in ("idle", "hostile"):
        assert positive(result[phase]["count"], result[phase]["p50_ms"], result[phase]["p99_ms"])
        assert positive(result["by_kind"]["grpc_infer"][phase]["count"])
