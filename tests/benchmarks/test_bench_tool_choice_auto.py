"""benchmarks/tool_choice_auto.py against the gateway on the tiny model: two asks of each list, counts in range."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import tool_choice_auto
from tests.benchmarks.smoke import thread_server
from tests.e2e.conftest import RunningServer
from tests.tiny_models import build_tiny_model

pytestmark = pytest.mark.benchmark_smoke


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The tiny model with room for the tool prompt (about 1,700 of its tokens)."""
    model = build_tiny_model(tmp_path_factory.mktemp("tools"), "llama", max_position_embeddings=2048)
    server = thread_server(model, max_num_tokens=2048, max_kv_tokens=8192).start()
    yield server
    server.stop()


def test_result_json(gateway: RunningServer, tmp_path: Path) -> None:
    out = tmp_path / "tool-choice.json"
    assert tool_choice_auto.main(["--url", gateway.url, "--limit", "2", "--max-tokens", "64", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert (result["model"], result["asks_needing_a_tool"], result["asks_needing_none"]) == ("tiny", 2, 2)
    for key in ("auto_right_call", "auto_any_call", "auto_call_when_none_needed", "required_right_call",
                "required_right_name"):
        assert 0 <= result[key] <= 2
    assert [row["expected"] for row in result["rows"]] == ["get_weather", "get_weather", None, None]
    assert all(len(row["required"]) == 1 for row in result["rows"][:2])  # a forced call: exactly one
