"""benchmarks/int4_gemv_sass.py on the CPU: the INT4 GEMV compiled for an H200 (sm_90) by Triton's own ptxas, no GPU.
The two-weights-an-instruction paths (PAIRS 1 and 2) must compile there (their inline PTX is never run on CPU: the
interpreter takes the float32 path) and cost fewer instructions a weight in the step loop than the float32 path at
the same tile."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

pytest.importorskip("triton")
from benchmarks.int4_gemv_sass import census

TILE = (128, 16, 4, 1, 0)  # 16 packed words of 8 weights a thread a step (128 rows x 16 words, 128 threads)


@cache
def _census(dtype: str, pairs: int) -> dict[str, Any]:
    return census((*TILE, pairs), dtype=dtype)


@pytest.mark.parametrize(("dtype", "pairs"), [("bf16", 1), ("bf16", 2), ("fp16", 2)])
def test_the_pairs_paths_compile_for_sm90_with_fewer_instructions_a_weight(dtype: str, pairs: int) -> None:
    fma, paired = _census(dtype, 0), _census(dtype, pairs)
    assert paired["per_weight"] < 0.75 * fma["per_weight"], (paired, fma)
    # 4 pairs a word: a 16-bit FMA or MUL each, 64 a step
    assert paired["opcodes"].get("HFMA2", 0) + paired["opcodes"].get("HMUL2", 0) >= 64, paired
    # float32 FFMAs: one a weight (128) on the float32 path, one a 16-bit sum (the scale's: 16 / PAIRS) in pairs
    assert fma["opcodes"]["FFMA"] >= 128 and paired["opcodes"].get("FFMA", 0) <= 16 // pairs, (paired, fma)
