"""benchmarks/cuda_decode_attention.py in seconds: every setting runs and equals the default's output (Triton's
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
    from benchmarks import cuda_decode_attention

    cuda_decode_attention.main(["--smoke", "--rows", "1,3", "--contexts", "40", "--block-n", "16,32", "--num-warps",
                                "4"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["rows"], r["block_n"]) for r in rows] == [(1, 16), (1, 32), (3, 16), (3, 32)]
    assert all(r["max_diff"] < 1e-5 for r in rows)
