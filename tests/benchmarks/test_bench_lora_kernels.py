"""benchmarks/lora_kernels_bench.py --device cpu --smoke: one layer of tiny Linears, every variant, its Triton
kernels in Triton's interpreter (in the run's interpreter child: tests/triton_interpreter.py). On the
CPU the variants run eagerly; the CUDA-graph capture and replay need CUDA."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.smoke import positive
from tests.triton_interpreter import interpreter_only, run_in_interpreter

pytestmark = pytest.mark.benchmark_smoke
pytest.importorskip("triton")


def test_kernels_in_triton_interpreter() -> None:
    run_in_interpreter(__file__, passed=1)


@interpreter_only
def test_every_variant(tmp_path: Path) -> None:
    out = tmp_path / "kernels.json"
    from benchmarks import lora_kernels_bench

    lora_kernels_bench.main(["--device", "cpu", "--smoke", "--tokens", "4", "--caps", "8", "--json", str(out)])
    rows = json.loads(out.read_text())
    assert [r["variant"] for r in rows] == ["base matmuls", "folded", "gemm+expand", "dense"]
    assert all(positive(r["us"], r["ratio_to_base"]) for r in rows) and rows[0]["ratio_to_base"] == 1.0
