"""benchmarks/ab_table.py: each side's parts merged, one row per figure, new / base in the last column, a part that
did not run leaving its rows empty (benchmarks/gpu_ab.sh's table; the script itself was run with SMOKE=1)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.ab_table import table
from benchmarks.gpu_bench import SMOKE

SIZES = {"sizes": {**SMOKE.__dict__}}


def write(out: Path, name: str, results: dict[str, object]) -> None:
    (out / name).mkdir(parents=True)
    (out / name / "gpu_bench.json").write_text(json.dumps({**SIZES, **results}))


def test_parts_merge_per_side_and_the_ratio_is_new_over_base(tmp_path: Path) -> None:
    write(tmp_path, "base-engine", {"engine": {"decode_b1_itl_ms_p50": 2.0, "closed_loop_8_tok_s_client_procs": 1000.0}})
    write(tmp_path, "base-http_batch", {"http_batch": {"summary": {"output_token_throughput": 900.0}}})
    write(tmp_path, "new-engine", {"engine": {"decode_b1_itl_ms_p50": 1.5, "closed_loop_8_tok_s_client_procs": 1000.0}})
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table(tmp_path, "base", "new").splitlines()}
    assert rows["decode batch 1, ITL p50 ms (in-process)"] == "| decode batch 1, ITL p50 ms (in-process) | 2 | 1.5 | 0.750 |"
    assert rows["HTTP / core"] == "| HTTP / core | 0.9 |  |  |"  # new's HTTP part did not run
    assert rows["core, 8 closed-loop streams, tok/s"].endswith("| 1000 | 1000 | 1.000 |")
