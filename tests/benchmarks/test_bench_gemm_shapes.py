"""benchmarks/gemm_shapes.py in seconds on the CPU: every projection and variant prints its line (no timing here)."""

from __future__ import annotations

import json

import pytest

from benchmarks import gemm_shapes

pytestmark = pytest.mark.benchmark_smoke


def test_every_projection_and_variant_prints_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    gemm_shapes.main(["--smoke"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["projection"], r["variant"]) for r in lines] == [
        ("qkv", "linear"), ("o", "linear"), ("gate_up", "linear"), ("gate_up", "halves"), ("down", "linear")]
