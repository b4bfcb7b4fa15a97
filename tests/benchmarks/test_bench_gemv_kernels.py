"""benchmarks/gemv_kernels.py in seconds: every setting runs and gives the unfused projection's output (Triton's
interpreter on a CPU-only box)."""

from __future__ import annotations

import json

import pytest

from tests.triton_interpreter import interpreter_only, run_in_interpreter

pytestmark = pytest.mark.benchmark_smoke
pytest.importorskip("triton")


def test_kernels_in_triton_interpreter() -> None:
    run_in_interpreter(__file__, passed=1)


@interpreter_only
def test_every_setting_runs_and_agrees(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import gemv_kernels

    gemv_kernels.main(["--smoke", "--block-n", "4,8", "--block-k", "16,64", "--num-warps", "4"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    gemv = [r for r in rows if r.get("setting") == "gemv"]
    assert [(r["shape"], r["block_n"], r["block_k"]) for r in gemv] == [
        (shape, n, k) for shape in ("qkv", "gate_up", "down") for n in (4, 8) for k in (16, 64)]
    assert all(r["max_diff"] < 0.1 for r in gemv)  # bf16 outputs of size ~1-3: a few rounding steps at most
    assert [r["shape"] for r in rows if r.get("setting") == "cublas"] == ["qkv", "gate_up", "down"]
    assert set(rows[-1]["best"]) == {"qkv", "gate_up", "down"}
