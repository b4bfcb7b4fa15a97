"""benchmarks/int4_gemv_sass.py on the CPU: the INT4 GEMV compiled for an H200 (sm_90) by Triton's own ptxas, no GPU.
The two-weights-an-instruction path (PAIRS) must compile there (its inline PTX is never run on CPU: the interpreter
takes the float32 path) and cost fewer instructions a weight in the step loop than the float32 path at the same tile."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")
from benchmarks.int4_gemv_sass import census  # noqa: E402


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_the_pairs_path_compiles_for_sm90_with_fewer_instructions_a_weight(dtype: str) -> None:
    fma, pairs = census((128, 16, 4, 1, 0, 0), dtype=dtype), census((128, 16, 4, 1, 0, 1), dtype=dtype)
    assert pairs["per_weight"] < 0.75 * fma["per_weight"], (pairs, fma)
    # 128 rows x 16 words, 4 warps: 16 words of 8 weights a thread, 4 pairs a word: a 16-bit FMA or MUL each
    assert pairs["opcodes"].get("HFMA2", 0) + pairs["opcodes"].get("HMUL2", 0) >= 64, pairs
    # float32 FFMAs: one a weight (128) on the float32 path, one a word (the scale's, 16) in pairs
    assert fma["opcodes"]["FFMA"] >= 128 and pairs["opcodes"].get("FFMA", 0) <= 16, (pairs, fma)
