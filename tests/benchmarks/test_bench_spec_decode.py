"""benchmarks/spec_decode.py on the demo pair (none, draft, ngram; one request of 8 tokens), and
benchmarks/plot_spec_sweep.py drawing a K sweep from its JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import plot_spec_sweep, spec_decode
from tests.benchmarks.smoke import positive

pytestmark = pytest.mark.benchmark_smoke


@pytest.fixture(scope="module")
def spec_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("spec") / "spec-k4.json"
    spec_decode.main(["--dtype", "float32", "--concurrency", "1", "--requests-per-slot", "1", "--max-tokens", "8",
                      "--num-draft-tokens", "4", "--json", str(out), "--profile", str(out.parent / "profile")])
    return out


def test_spec_decode_rows(spec_json: Path) -> None:
    data: dict[str, Any] = json.loads(spec_json.read_text())
    rows = {row["mode"]: row for row in data["rows"]}
    assert list(rows) == ["none", "draft", "ngram"]
    for row in rows.values():
        assert row["completion_tokens"] == 8 and positive(row["tokens_per_s"], row["speedup"], row["cpu_speedup"])
    assert rows["none"]["speedup"] == 1.0
    assert rows["draft"]["outputs_equal_baseline"] and rows["ngram"]["outputs_equal_baseline"]  # greedy, float32
    assert 0 <= rows["draft"]["acceptance_rate"] <= 1
    assert data["meta"]["args"]["num_draft_tokens"] == "4"
    for mode in rows:  # --profile: the engine's steps under cProfile, a file a mode
        profile = (spec_json.parent / "profile" / f"profile_{mode}_c1.txt").read_text()
        assert "engine_core.py" in profile and "Ordered by: cumulative time" in profile


def test_plot_spec_sweep(spec_json: Path, tmp_path: Path) -> None:
    data = json.loads(spec_json.read_text())
    data["meta"]["args"]["num_draft_tokens"] = "2"  # a second point of the sweep: the same rows at another K
    k2 = tmp_path / "spec-k2.json"
    k2.write_text(json.dumps(data))
    out = tmp_path / "sweep.png"
    plot_spec_sweep.main([str(spec_json), str(k2), "--out", str(out)])
    assert out.read_bytes()[:4] == b"\x89PNG"
    series = plot_spec_sweep.load([spec_json, k2])
    assert sorted(series) == ["draft", "ngram"] and [k for k, *_ in series["draft"]] == [2, 4]


def test_early_exit_draft_speculates_exactly(tmp_path: Path) -> None:
    """--draft-layers 1: the demo model's first layer drafts for it; greedy outputs stay those of plain decoding."""
    out = tmp_path / "early-exit.json"
    spec_decode.main(["--dtype", "float32", "--concurrency", "1", "--requests-per-slot", "1", "--max-tokens", "8",
                      "--modes", "none", "draft", "--draft-layers", "1", "--json", str(out)])
    rows = {row["mode"]: row for row in json.loads(out.read_text())["rows"]}
    assert rows["draft"]["outputs_equal_baseline"] is True
    assert 0 <= rows["draft"]["acceptance_rate"] <= 1
