"""benchmarks/gpu_moe_profile.py in seconds on the CPU: every phase runs on the tiny Qwen3-MoE shape in Triton's
interpreter and writes its figures (timings mean nothing here; the check's error does)."""

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
def test_every_phase_runs_and_writes_its_figures(tmp_path: Path) -> None:
    from benchmarks import gpu_moe_profile

    assert gpu_moe_profile.main(["--smoke", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "gpu_moe_profile.json").read_text())
    b1, layer = result["b1"], result["moe_layer"]
    assert positive(result["bandwidth_tb_s"], b1["step_ms"], b1["floor_ms"], b1["vs_floor"], b1["general_moe_ms"])
    assert positive(layer["floor_us"], layer["one_token_us"], layer["general_us"])
    assert [key for key in layer if key.startswith(("gate_up_tile_", "down_tile_", "router_"))] == [
        "gate_up_tile_2x1024x4_us", "down_tile_4x1024x4_us", "router_4x1024x4_us", "router_2x2048x4_us"]
    assert positive(*(layer["parts"][key] for key in ("without_down_kernel_us", "without_gate_up_kernel_us",
                                                      "no_pdl_us", "dense_gate_up_us", "dense_down_floor_us")))
    wide = result["moe_256"]
    assert positive(wide["floor_us"], wide["table_us"], wide["tile_16x64x64x4x3_us"])
    assert wide["table_tile"] == "16x64x128x4x3"  # 24 rows: GEMM_TILES' first
    table = result["kernels"]
    assert table["launches_per_step"] > 0 and table["top"][0]["us_per_step"] >= table["top"][-1]["us_per_step"]
    # one_token_moe against the eager layer: bf16 in the interpreter (which truncates), so within a few roundings
    assert result["check"]["max_rel_err"] < 2e-2
