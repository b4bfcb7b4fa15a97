"""benchmarks/lora_kernels_bench.py --device cpu --smoke: one layer of tiny Linears, every variant, its Triton
kernels in Triton's interpreter (a child process: TRITON_INTERPRET must be set before Triton is imported). On the
CPU the variants run eagerly; the CUDA-graph capture and replay need CUDA."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.smoke import output_of, positive, run_module

pytestmark = pytest.mark.benchmark_smoke
pytest.importorskip("triton")


def test_every_variant(tmp_path: Path) -> None:
    out = tmp_path / "kernels.json"
    proc = run_module("lora_kernels_bench", "--device", "cpu", "--smoke", "--tokens", "4", "--caps", "8",
                      "--json", str(out), env={"TRITON_INTERPRET": "1"})
    assert proc.returncode == 0, output_of(proc)
    rows = json.loads(out.read_text())
    assert [r["variant"] for r in rows] == ["base matmuls", "folded", "gemm+expand", "dense"]
    assert all(positive(r["us"], r["ratio_to_base"]) for r in rows) and rows[0]["ratio_to_base"] == 1.0
