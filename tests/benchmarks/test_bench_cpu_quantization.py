"""benchmarks/cpu_quantization.py on the tiny model: every setting's speed and perplexity, the RESULTS section."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import cpu_quantization

pytestmark = pytest.mark.benchmark_smoke


def test_speed_quality_and_section(tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_quantization, "RESULTS_MD", tmp_path / "RESULTS.md")
    code = cpu_quantization.main(["--model", str(tiny_model), "--settings", "float32:none,float32:int8,float32:int4",
                                  "--prompt", "8", "--output", "4", "--rounds", "1", "--window", "32",
                                  "--text-tokens", "96", "--append-results"])
    assert code == 0
    section = (tmp_path / "RESULTS.md").read_text()
    # a float32 checkpoint's default here is float32 without quantization (runtime/native/cpu/defaults.py)
    assert "| float32 none (the default here) |" in section
    assert all(f"| float32 {q} |" in section for q in ("int8", "int4")) and "perplexity" in section
