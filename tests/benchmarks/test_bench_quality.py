"""benchmarks/fp8_quality.py and benchmarks/int4_quality.py on the tiny model: a perplexity line per setting, bf16
first; the FP8 tensor-core settings (a GPU's; on the CPU fp8_linear's own product) through the same replacement."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import cpu_quantization, fp8_quality, int4_quality

pytestmark = pytest.mark.benchmark_smoke

ROW = re.compile(r"^\| (.+) \| ([\d.]+) \| ([+-][\d.]+%) \|$")


def _rows(text: str) -> dict[str, float]:
    return {m[1]: float(m[2]) for line in text.splitlines() if (m := ROW.match(line))}


def test_fp8_quality_prints_every_setting(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert fp8_quality.main(["--model", str(tiny_model), "--text-tokens", "64", "--window", "32"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert list(rows) == list(fp8_quality.SETTINGS) and all(v > 0 for v in rows.values())


def test_fp8_tensor_core_settings_replace_the_products(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `--device cuda` adds, run here: each projection through fp8_linear, FAST_ACCUM set per setting."""
    monkeypatch.setattr(fp8_quality.fp8, "FAST_ACCUM", fp8_quality.fp8.FAST_ACCUM)
    import torch

    _, result = cpu_quantization.perplexities(str(tiny_model), torch.bfloat16, 32, 64,
                                              ("bf16", *fp8_quality.TENSOR_CORE_SETTINGS), fp8_quality._e4m3)
    assert fp8_quality.fp8.FAST_ACCUM is True  # the last setting's
    assert result["bf16"] != result["fp8 tensor cores"] and all(v > 0 for v in result.values())


def test_int4_quality_prints_both_settings(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert int4_quality.main(["--model", str(tiny_model), "--text-tokens", "64", "--window", "32",
                              "--group", "32"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert len(rows) >= 2 and all(v > 0 for v in rows.values())
