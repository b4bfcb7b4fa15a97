"""benchmarks/cpu_quantization.py on the tiny model: every setting's speed and perplexity, the RESULTS section."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import cpu_quantization

pytestmark = pytest.mark.benchmark_smoke


def test_speed_quality_and_section(tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_quantization, "RESULTS_MD", tmp_path / "RESULTS.md")
    code = cpu_quantization.main(["--model", str(tiny_model), "--dtype", "float32", "--prompt", "8", "--output", "4",
                          "--rounds", "1", "--window", "32", "--text-tokens", "96", "--append-results"])
    assert code == 0
    section = (tmp_path / "RESULTS.md").read_text()
    assert all(f"| {q} |" in section for q in ("none", "int8", "int4")) and "perplexity" in section
