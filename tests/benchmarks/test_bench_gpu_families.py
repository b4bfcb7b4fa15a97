"""benchmarks/gpu_families.py in seconds on the CPU: every phase runs on tiny shapes of the three families and writes
its figures (they mean nothing here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import runtime.native.core_loader
from benchmarks import gpu_families
from tests.benchmarks.smoke import positive

pytestmark = pytest.mark.benchmark_smoke


def test_every_phase_runs_and_writes_its_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # in this process (a Python start with torch fewer); main puts random_model in the loader's place: put back after
    monkeypatch.setattr(runtime.native.core_loader, "load_model", runtime.native.core_loader.load_model)
    assert gpu_families.main(["--smoke", "--device", "cpu", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "gpu_families.json").read_text())
    for shape in ("llama-3.1-8b", "qwen3-8b", "qwen3-30b-a3b"):
        figures = result[shape]
        assert positive(figures["decode_b1_itl_ms"], figures["throughput_8_tok_s"], figures["floor_b1_ms"],
                        figures["vs_floor"]), figures
    # the MoE step reads its top-2 of 8 experts: its floor is below the dense shape's of the same width
    assert result["qwen3-30b-a3b"]["floor_bytes"] < result["qwen3-8b"]["floor_bytes"]
    assert positive(result["qwen3-30b-a3b_hf_8"]["batch8_output_tok_s"], result["moe_vs_dense_8b"])
