"""benchmarks/cpu_ab.py's smoke run: one round of each side (this tree against itself), the demo model, 0.3 s of
load: both sides serve, and the table holds every figure with its ratio. The servers run in their own processes;
the load generator runs in this one (conftest.load_generator_here)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import cpu_ab

ROOT = Path(__file__).resolve().parents[2]


def test_one_round_each_side_gives_the_table(tmp_path: Path, load_generator_here: None) -> None:
    out = tmp_path / "ab.json"
    assert cpu_ab.main([str(ROOT), str(ROOT), "--duration", "0.3", "--concurrency", "2", "--output", "4", "--rounds",
                        "1", "--out", str(out), "--", "--model", "demo", "--no-engine-process"]) == 0
    result = json.loads(out.read_text())
    (base,), (new,) = result["points"]["base"], result["points"]["new"]
    assert set(base) == set(new) == {"c2_output_tok_s", "c2_tpot_ms_p50", "front_end_rss_mb", "others_rss_mb"}
    assert base["c2_output_tok_s"] > 0 and new["front_end_rss_mb"] > 50
    assert result["table"].count("\n") == 5 and "| c2_output_tok_s |" in result["table"]
