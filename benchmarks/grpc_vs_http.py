"""Triton clients' two streaming transports on one server: KServe v2 gRPC ModelStreamInfer against HTTP
`generate_stream` (SSE), same model, same prompts, same load, in one run.

    python -m benchmarks.grpc_vs_http                         # demo model, concurrency 1,16,64, 3 repeats
    python -m benchmarks.grpc_vs_http --append-results        # also a dated section in RESULTS.md

The server runs in its own process (the engine core in another); the load generator
(`python -m benchmarks.serve --api triton | triton-grpc`) in a third. The transports alternate at every
point and repeat (drift in a shared machine's load hits both alike); the table shows medians, and
each ratio is the median of the per-repeat ratios. The baseline is HTTP generate_stream, measured in
the same run.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks.overhead import RESULTS_MD, _commit, _machine
from benchmarks.procs import Server, free_port, run_load_generator
from benchmarks.report import append_section, markdown_table, plot_throughput_by_concurrency, write_json

RESULTS_DIR = Path(__file__).parent / "results"
TRANSPORTS = {"HTTP generate_stream": "triton", "gRPC ModelStreamInfer": "triton-grpc"}


def _server(args: argparse.Namespace, grpc_port: int) -> Server:
    cmd = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "{port}", "--model", args.model,
           "--grpc-port", str(grpc_port), "--log-level", "warning", "--max-batch-size", str(max(args.concurrency))]
    return Server("", command=cmd, ready_path="/health")


def _point(server: Server, grpc_port: int, api: str, c: int, args: argparse.Namespace) -> dict[str, Any]:
    argv = ["--base-url", server.base_url, "--api", api, "--grpc-url", f"127.0.0.1:{grpc_port}", "--model", "ensemble",
            "--concurrency", str(c), "--num-prompts", "64", "--input-mean", str(args.input_tokens), "--input-std", "0",
            "--output-mean", str(args.output_tokens), "--output-std", "0", "--duration", str(args.duration),
            "--warmup", str(min(c, 8))] + (["--tokenizer", args.tokenizer] if args.tokenizer else [])
    return run_load_generator(argv)["points"][0]["summary"]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="demo", help="what `serve --model` takes (default: the demo model)")
    p.add_argument("--tokenizer", help="tokenizer folder for the prompts (default: the demo model's)")
    p.add_argument("--concurrency", type=lambda s: [int(v) for v in s.split(",")], default=[1, 16, 64])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--duration", type=float, default=8.0, help="seconds per point")
    p.add_argument("--input-tokens", type=int, default=64)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--note", default="")
    p.add_argument("--append-results", action="store_true")
    args = p.parse_args(argv)
    console = Console()
    command = "python -m benchmarks.grpc_vs_http " + shlex.join(sys.argv[1:] if argv is None else argv)
    grpc_port = free_port()
    server = _server(args, grpc_port)
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {label: {c: [] for c in args.concurrency} for label in TRANSPORTS}
    try:
        server.wait_ready()
        for c in args.concurrency:
            for r in range(args.repeat):
                order = list(TRANSPORTS.items()) if r % 2 == 0 else list(TRANSPORTS.items())[::-1]
                for label, api in order:
                    cpu = server.cpu_seconds()
                    s = _point(server, grpc_port, api, c, args)
                    # the front end's CPU per output token (the engine core is another process): the transport's
                    # own cost, apart from the load generator's, which shares the machine
                    tokens = s["mean_output_tokens"] * (s["requests"] + min(c, 8))  # the warmup's included
                    s["server_cpu_ms_per_token"] = (server.cpu_seconds() - cpu) * 1e3 / max(tokens, 1)
                    runs[label][c].append(s)
                    console.print(f"{label:22s} c={c:<3d} repeat {r + 1}/{args.repeat}: "
                                  f"{s['output_token_throughput']:.0f} output tok/s, {s['failed']} failed")
    finally:
        server.stop()
    md = _report(console, runs, args, command)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    RESULTS_DIR.mkdir(exist_ok=True)
    write_json(RESULTS_DIR / f"grpc-vs-http-{stamp}.json", {"command": command, "runs": runs})
    png = plot_throughput_by_concurrency(
        {label: {c: _median([s["output_token_throughput"] for s in points[c]]) for c in points}
         for label, points in runs.items()}, None, RESULTS_DIR / f"grpc-vs-http-{stamp}.png",
        f"{args.model}: Triton streaming transports, output tokens/s (median of {args.repeat})")
    md += f"\n![output tok/s by concurrency](results/{png.name})\n"
    console.print(f"plot: {png}")
    if args.append_results:
        append_section(RESULTS_MD, md, console)
    failed = sum(s["failed"] for points in runs.values() for ss in points.values() for s in ss)
    return 1 if failed else 0


def _report(console: Console, runs: dict[str, dict[int, list[dict[str, Any]]]], args: argparse.Namespace,
            command: str) -> str:
    """Print the table; return the RESULTS.md section."""
    http, grpc = list(TRANSPORTS)
    cols = ["concurrency", "HTTP tok/s", "gRPC tok/s", "gRPC / HTTP", "HTTP TTFT p50 ms", "gRPC TTFT p50 ms",
            "HTTP ITL p50 ms", "gRPC ITL p50 ms", "front-end CPU ms/token HTTP", "gRPC", "failed"]
    rows = []
    for c in args.concurrency:
        h, g = runs[http][c], runs[grpc][c]

        def med(ss: list[dict[str, Any]], key: str) -> float:
            return _median([s[key]["p50"] for s in ss if s.get(key)])

        ratio = _median([b["output_token_throughput"] / max(a["output_token_throughput"], 1e-9) for a, b in zip(h, g)])
        rows.append([str(c), f"{_median([s['output_token_throughput'] for s in h]):.0f}",
                     f"{_median([s['output_token_throughput'] for s in g]):.0f}", f"{ratio:.2f}",
                     f"{med(h, 'ttft_ms'):.1f}", f"{med(g, 'ttft_ms'):.1f}", f"{med(h, 'itl_ms'):.1f}",
                     f"{med(g, 'itl_ms'):.1f}", f"{_median([s['server_cpu_ms_per_token'] for s in h]):.3f}",
                     f"{_median([s['server_cpu_ms_per_token'] for s in g]):.3f}", str(sum(s["failed"] for s in h + g))])
    table = markdown_table(cols, rows)
    console.print(table)
    return "\n".join([
        f"\n## {time.strftime('%Y-%m-%d %H:%M')} Triton streaming transports: gRPC ModelStreamInfer vs HTTP "
        f"generate_stream ({args.model}, CPU)\n",
        f"- machine: {_machine()}" + (f"; {args.note}" if args.note else ""),
        f"- commit: {_commit()}",
        f"- command: `{command}`",
        f"- load: closed loop, {args.duration:g} s per point, {args.repeat} repeats alternating the transports, "
        f"model `ensemble`, prompts {args.input_tokens} tokens, {args.output_tokens} output tokens (min_length = "
        "max_tokens); medians, the ratio is the median of per-repeat ratios; baseline: HTTP generate_stream\n",
        table, "",
    ])


if __name__ == "__main__":
    sys.exit(main())
