"""benchmarks/cpu_int8.py on the tiny model: both settings' speed, the perplexity pair, the RESULTS section."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import cpu_int8

pytestmark = pytest.mark.benchmark_smoke


def test_speed_quality_and_section(tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_int8, "RESULTS_MD", tmp_path / "RESULTS.md")
    code = cpu_int8.main(["--model", str(tiny_model), "--dtype", "float32", "--prompt", "8", "--output", "4",
                          "--rounds", "1", "--window", "32", "--text-tokens", "96", "--append-results"])
    assert code == 0
    section = (tmp_path / "RESULTS.md").read_text()
    assert "| none |" in section and "| int8 |" in section and "perplexity" in section
