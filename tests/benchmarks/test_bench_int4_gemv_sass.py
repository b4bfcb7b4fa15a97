"""benchmarks/int4_gemv_sass.py on the CPU: the INT4 GEMV compiled for sm_90 by Triton's own ptxas, its step loop
counted. The point of issue 44's variants, checked in the code the GPU would run: "v3" converts every weight
(I2F), "fma" and "dotw" none, "dotw" multiplies on the tensor cores (HGMMA)."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.smoke import output_of, run_module

pytestmark = pytest.mark.benchmark_smoke
pytest.importorskip("triton")


def _census(variant: str, tile: str) -> tuple[float, dict[str, int]]:
    proc = run_module("int4_gemv_sass", "--variant", variant, "--tile", tile, timeout=120)
    assert proc.returncode == 0, output_of(proc)
    name, shown, per_weight, _, _, figures = proc.stdout.strip().split(" ", 5)
    assert (name, shown) == (variant, tile.replace(",", "x"))
    opcodes, usage = figures.split("} {")
    assert json.loads("{" + usage)["local"] == 0  # no spills
    return float(per_weight), json.loads(opcodes + "}")


def test_only_v3_converts_each_weight_and_dotw_multiplies_on_tensor_cores() -> None:
    weights = {"v3": 16 * 32 * 8 / 128, "fma": 128 * 16 * 8 / 128, "dotw": 128 * 16 * 8 / 128}  # a thread's, a step
    census = {"v3": _census("v3", "16,32,4,1,1"), "fma": _census("fma", "128,16,4,1,0"),
              "dotw": _census("dotw", "128,16,4,1,0")}
    conversions = {v: sum(n for op, n in opcodes.items() if op.startswith("I2F")) / weights[v]
                   for v, (_, opcodes) in census.items()}
    assert conversions["v3"] >= 1 and conversions["fma"] < 0.05 and conversions["dotw"] < 0.05, conversions
    assert census["dotw"][1].get("HGMMA", 0) > 0 and "HGMMA" not in census["fma"][1]
    assert census["dotw"][0] < census["fma"][0] < census["v3"][0]
