"""benchmarks/cuda_prefill_attention.py in seconds: every setting runs and keeps the sampled rows' bits equal to the
decode kernel's (Triton's interpreter on a CPU-only box)."""

from __future__ import annotations

import json

import pytest

from tests.triton_interpreter import interpreter_only, run_in_interpreter

pytestmark = pytest.mark.benchmark_smoke
pytest.importorskip("triton")


def test_kernels_in_triton_interpreter() -> None:
    run_in_interpreter(__file__, passed=1)


@interpreter_only
def test_every_setting_runs_and_keeps_the_decode_kernels_bits(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import cuda_prefill_attention

    cuda_prefill_attention.main(["--smoke", "--block-m", "16,32", "--num-warps", "4", "--num-stages", "2"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["block_m"] for r in rows] == [16, 32]
    assert all(r["same_bits_as_decode"] for r in rows)
