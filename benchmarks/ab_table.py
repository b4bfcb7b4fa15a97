"""The table of an A/B run of gpu_bench (benchmarks/gpu_ab.sh): one row per headline figure, one column per side.

    python -m benchmarks.ab_table OUT base new      # OUT/<side>-<part>/gpu_bench.json, parts merged per side

Each side's figures come from its own parts (the engine phase, the HTTP phase), run alternately; a part that failed
or ran out of time leaves its rows empty. The last column is new / base: under 1 is better for the ms rows, over 1
for the tok/s rows and HTTP / core.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.gpu_bench import FULL, Sizes, summary


def side_results(out: Path, side: str) -> dict[str, Any]:
    """Every part's gpu_bench.json of `side`, merged (the phases differ between parts)."""
    merged: dict[str, Any] = {}
    for path in sorted(out.glob(f"{side}-*/gpu_bench.json")):
        merged.update(json.loads(path.read_text()))
    return merged


def rows(r: dict[str, Any]) -> dict[str, float | None]:
    """The compared figures of one side's merged results (None where missing)."""
    s = Sizes(**r["sizes"]) if "sizes" in r else FULL
    head = summary(r)
    engine, http = r.get("engine") or {}, (r.get("http_batch") or {}).get("summary") or {}
    core, served = head[f"engine_client_{s.batch}_closed_loop_tok_s"], head[f"http_{s.batch}_tok_s"]
    return {
        "decode batch 1, ITL p50 ms (in-process)": head["decode_b1_itl_ms"],
        "decode batch 1, ITL p50 ms (engine core process)": head["decode_b1_itl_client_ms"],
        "decode batch 1, graph GPU ms": head["decode_b1_graph_ms"],
        f"TTFT {s.ttft_prompt} tokens, p50 ms (in-process)": head[f"ttft_{s.ttft_prompt}_ms"],
        f"TTFT {s.ttft_prompt} tokens, p50 ms (engine core process)": engine.get(f"ttft_{s.ttft_prompt}_ms_p50_client"),
        f"{s.batch} x {s.prompt}/{s.output}, tok/s (in-process)": head[f"engine_{s.batch}_tok_s"],
        f"{s.batch} x {s.prompt}/{s.output}, tok/s (engine core process)": head[f"engine_client_{s.batch}_tok_s"],
        f"core, {s.batch} closed-loop streams, tok/s": core,
        f"HTTP, {s.batch} streams, tok/s": served,
        "HTTP / core": served / core if served and core else None,
        f"HTTP, {s.batch} streams, TTFT p50 ms": (http.get("ttft_ms") or {}).get("p50"),
    }


def table(out: Path, base: str, new: str) -> str:
    a, b = rows(side_results(out, base)), rows(side_results(out, new))

    def cell(v: float | None) -> str:
        return "" if v is None else f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"

    lines = [f"| figure | {base} | {new} | {new} / {base} |", "|---|---|---|---|"]
    for name in a:
        ratio = b[name] / a[name] if a[name] and b[name] is not None else None
        lines.append(f"| {name} | {cell(a[name])} | {cell(b[name])} | {'' if ratio is None else f'{ratio:.3f}'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1]), *sys.argv[2:4]))
