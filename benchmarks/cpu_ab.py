"""A/B of two trees of the gateway serving on the CPU, as a user starts it (`gateway serve`, its defaults):

    python -m benchmarks.cpu_ab BASE_FOLDER NEW_FOLDER                  # e.g. .ab/base (benchmarks/ab_prepare.sh) and .
    python -m benchmarks.cpu_ab BASE NEW --duration 20 -- --model demo  # anything after -- goes to `serve`

Each side's server runs from its own folder (cwd and PYTHONPATH on it). The sides alternate, base-new-new-base, so
a drift of the shared machine's load falls on both alike. Per start: streamed completions (128-token prompts,
`--output` tokens, ignore_eos) closed-loop at each `--concurrency` for `--duration` s, then the RSS of each of the
server's processes at idle. Prints a Markdown table (each figure the mean of a side's rounds, and new / base) and
writes it with the raw points to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import psutil

from benchmarks.procs import Server, run_load_generator


def _rss_mb(server: Server) -> dict[str, float]:
    """RSS (MB) of the server's first process (the front end) and of all its descendants together."""
    root = psutil.Process(server.proc.pid)
    rest = sum(p.memory_info().rss for p in root.children(recursive=True))
    return {"front_end_rss_mb": root.memory_info().rss / 2**20, "others_rss_mb": rest / 2**20}


def _round(folder: Path, args: argparse.Namespace) -> dict[str, float]:
    command = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "{port}",
               "--grpc-port", "none", *args.serve_args]
    server = Server("", command=command, cwd=folder, env={"PYTHONPATH": str(folder)}, ready_path="/health")
    try:
        server.wait_ready(args.timeout)
        point: dict[str, float] = {}
        for c in args.concurrency:
            result = run_load_generator(["--base-url", server.base_url, "--concurrency", str(c), "--duration",
                                         str(args.duration), "--output-mean", str(args.output), "--output-std", "0",
                                         "--warmup", str(c)], timeout=args.duration + 300)["points"][0]["summary"]
            point[f"c{c}_output_tok_s"] = result["output_token_throughput"]
            point[f"c{c}_tpot_ms_p50"] = result["tpot_ms"]["p50"]
            assert result["failed"] == 0, result["errors"]
        point.update(_rss_mb(server))
        return point
    finally:
        server.stop()


def table(points: dict[str, list[dict[str, float]]]) -> str:
    keys = list(points["base"][0])
    mean = {side: {k: statistics.fmean(p[k] for p in rounds) for k in keys} for side, rounds in points.items()}
    rows = ["| figure | base | new | new / base |", "|---|---|---|---|"]
    rows += [f"| {k} | {mean['base'][k]:.1f} | {mean['new'][k]:.1f} | "
             f"{mean['new'][k] / mean['base'][k] if mean['base'][k] else float('nan'):.3f} |" for k in keys]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load per concurrency")
    parser.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[1, 16])
    parser.add_argument("--output", type=int, default=64, help="output tokens per request")
    parser.add_argument("--rounds", type=int, default=2, help="base-new-new-base pairs... (2: four starts)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a server may take to settle")
    parser.add_argument("--out", type=Path, default=Path("/tmp/cpu_ab.json"))
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.serve_args = argv[split + 1:]  # `serve` arguments
    order = ["base", "new", "new", "base"] * (args.rounds // 2) + ["base", "new"] * (args.rounds % 2)
    points: dict[str, list[dict[str, Any]]] = {"base": [], "new": []}
    for i, side in enumerate(order):
        print(f"[{i + 1}/{len(order)}] {side}", file=sys.stderr, flush=True)
        points[side].append(_round((args.base if side == "base" else args.new).resolve(), args))
    text = table(points)
    args.out.write_text(json.dumps({"points": points, "table": text}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
