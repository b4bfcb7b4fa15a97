"""benchmarks/guided_overhead.py on the demo model: a batch of 4 with 2 rows under the JSON schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import guided_overhead
from tests.benchmarks.smoke import positive

pytestmark = pytest.mark.benchmark_smoke


def test_result_json(tmp_path: Path) -> None:
    out = tmp_path / "guided.json"
    guided_overhead.main(["--batch", "4", "--constrained", "2", "--context", "16", "--warmup", "1", "--iters", "4",
                          "--json", str(out)])
    result = json.loads(out.read_text())
    assert (result["batch"], result["constrained"], result["iters"]) == (4, 2, 4)
    assert positive(result["compile_ms"], result["baseline_step_ms"], result["guided_step_ms"],
                    result["bitmask_fill_ms"], result["guided_work_ms"], result["guided_work_pct"])
    assert len(result["overhead_iqr_pct"]) == 2
