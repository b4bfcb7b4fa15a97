"""benchmarks/gpu_quant.py in seconds on the CPU: every phase runs on tiny shapes (the GEMVs in Triton's interpreter)
and writes its figures (the timings mean nothing here; the FP8 GEMV's error against its dequantized weight does)."""

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
def test_every_phase_runs_and_writes_its_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import runtime.native.core_loader
    from benchmarks import gpu_quant
    from runtime.native.cuda import int4_gemv

    # in the interpreter child, beside its kernel tests: main puts random weights in the loader's place and its
    # fastest INT4 GEMV tiles in int4_gemv.SHAPES; put both back after
    monkeypatch.setattr(runtime.native.core_loader, "load_model", runtime.native.core_loader.load_model)
    monkeypatch.setattr(int4_gemv, "SHAPES", dict(int4_gemv.SHAPES))
    assert gpu_quant.main(["--smoke", "--device", "cpu", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "gpu_quant.json").read_text())
    assert set(result["kernels"]) == {"qkv", "o", "gate_up", "down"}
    for figures in result["kernels"].values():
        assert figures["fp8_max_rel_err"] < 2e-2  # bf16 outputs (truncated by the interpreter)
        assert figures["fp8_floor_us"] < figures["bf16_floor_us"]
        # (the INT4 GEMV's error: int4_gemv's below)
        assert figures["int4_floor_us"] < figures["fp8_floor_us"]
        assert {"int4_us", "rows_256_int4_us", "int4_vs_floor"} <= set(figures)  # timed on a GPU only (nan here)
    for figures in result["int4_gemv"].values():  # the GEMV at its first tile, against its reference dequantization
        errors = {key: f["max_rel_err"] for key, f in figures.items() if key != "floor_us"}
        assert set(errors) == {"128x16x4x1x0x0"} and errors["128x16x4x1x0x0"] < 2e-2, errors  # bf16 outputs
    for quantization in ("bf16", "fp8", "int4", "kv_fp8"):
        figures = result[quantization]
        assert positive(figures["decode_b1_itl_ms"], figures["throughput_8_tok_s"], figures["vs_floor"]), figures
    assert result["int4"]["floor_bytes"] < result["bf16"]["floor_bytes"]  # (FP8 weights are dequantized on the CPU)
    assert positive(result["fp8_vs_bf16"], result["b1_fp8_vs_bf16"], result["int4_vs_bf16"], result["b1_int4_vs_bf16"],
                    result["kv_fp8_vs_bf16"])
