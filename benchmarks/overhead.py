"""Gateway-overhead benchmark: our gateway over the SyntheticEngine (no model) against the stack's
ceiling (benchmarks/ceiling_app.py: bare Starlette + uvicorn emitting the same SSE events).

    python -m benchmarks.overhead                       # 10 s per point, prints the table and ratios
    python -m benchmarks.overhead --append-results      # also appends a dated section to RESULTS.md
    python -m benchmarks.overhead --profile             # also py-spy the gateway at the top concurrency

Each server runs in its own uvicorn process on a free loopback port; the load generator runs in
another process. On a 2-core machine the client (Python, httpx) needs about as much CPU as the
server, so absolute events/s are client-bound at high concurrency; the server's CPU time per event
(read from /proc) is the figure that does not depend on the client, and it is reported too.

Targets (issue #5): streamed events/s >= 0.5 x the raw ceiling, and < 2 ms added p50 latency for a
non-streamed request at concurrency 1.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.procs import REPO_ROOT, Server, run_load_generator

RESULTS_MD = Path(__file__).parent / "RESULTS.md"
RESULTS_DIR = Path(__file__).parent / "results"


def gateway_app() -> Any:
    """uvicorn factory: our gateway over a SyntheticEngine (BENCH_TOKENIZER, BENCH_STEP_DELAY from env)."""
    from benchmarks.synthetic_engine import SyntheticEngine
    from gateway.app import create_app
    from gateway.settings import Settings
    from runtime.config import EngineConfig

    tokenizer = os.environ["BENCH_TOKENIZER"]
    engine = SyntheticEngine(tokenizer, step_delay=float(os.environ.get("BENCH_STEP_DELAY", "0")))
    settings = Settings(log_level="warning", engine=EngineConfig(served_model_name="synthetic", tokenizer=tokenizer))
    return create_app(settings, engine=engine)


def _client_argv(base_url: str, tokenizer: str, concurrency: int, duration: float, inp: int, out: int,
                 stream: bool, num_requests: int | None = None) -> list[str]:
    argv = ["--base-url", base_url, "--api", "completions", "--tokenizer", tokenizer, "--concurrency", str(concurrency),
            "--num-prompts", "64", "--input-mean", str(inp), "--input-std", "0", "--output-mean", str(out),
            "--output-std", "0", "--warmup", "0"]
    argv += ["--num-requests", str(num_requests)] if num_requests else ["--duration", str(duration)]
    return argv + ([] if stream else ["--no-stream"])


def _measure(server: Server, argv: list[str]) -> dict[str, Any]:
    cpu0 = server.cpu_seconds()
    summary = run_load_generator(argv)["points"][0]["summary"]
    summary["server_cpu_s"] = server.cpu_seconds() - cpu0
    return summary


def _p50(s: dict[str, Any], key: str) -> float:
    return s[key]["p50"] if s.get(key) else float("nan")


def _row(test: str, name: str, s: dict[str, Any]) -> list[str]:
    events = max(s["events_per_s"] * s["duration_s"], 1)
    units = events if s["events_per_s"] else max(s["completed"], 1)  # per event, or per request
    return [
        test, name, f"{s['events_per_s']:.0f}", f"{s['request_throughput']:.1f}",
        f"{s['server_cpu_s'] / units * 1e6:.0f}", f"{100 * s['server_cpu_s'] / s['duration_s']:.0f}%",
        f"{100 * s['client_cpu_s'] / s['duration_s']:.0f}%", f"{_p50(s, 'ttft_ms'):.2f}", f"{_p50(s, 'itl_ms'):.3f}",
        f"{_p50(s, 'e2e_ms'):.2f}", f"{s['e2e_ms']['p99'] if s['e2e_ms'] else float('nan'):.2f}", str(s["failed"]),
    ]


COLUMNS = ["test", "server", "events/s", "req/s", "srv CPU µs/event (µs/req)", "srv CPU", "client CPU",
           "TTFT p50 ms", "ITL p50 ms", "E2E p50 ms", "E2E p99 ms", "failed"]


def _verdicts(results: dict[tuple[str, str], dict[str, Any]], concurrencies: list[int]) -> list[str]:
    lines = []
    for c in concurrencies:
        g, base = results[(f"stream c={c}", "gateway")], results[(f"stream c={c}", "ceiling")]
        ratio = g["events_per_s"] / base["events_per_s"]
        cpu_ratio = (base["server_cpu_s"] / base["events_per_s"]) / (g["server_cpu_s"] / g["events_per_s"])
        lines.append(
            f"stream c={c}: events/s gateway/ceiling = {ratio:.2f} ({'PASS' if ratio >= 0.5 else 'FAIL'}, target >= 0.5); "
            f"server CPU per event ceiling/gateway = {cpu_ratio:.2f}; added TTFT p50 = "
            f"{_p50(g, 'ttft_ms') - _p50(base, 'ttft_ms'):+.2f} ms, added E2E p50 = {_p50(g, 'e2e_ms') - _p50(base, 'e2e_ms'):+.2f} ms"
        )
    g, base = results[("no-stream c=1", "gateway")], results[("no-stream c=1", "ceiling")]
    added = _p50(g, "e2e_ms") - _p50(base, "e2e_ms")
    lines.append(f"no-stream c=1: added p50 latency = {added:+.2f} ms ({'PASS' if added < 2.0 else 'FAIL'}, target < 2 ms)")
    return lines


def _machine() -> str:
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        info = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
        return f"{info.get('Model name', '?').strip()}, {info.get('CPU(s)', '?').strip()} CPUs ({platform.machine()})"
    except (OSError, subprocess.CalledProcessError):
        return f"{os.cpu_count()} CPUs ({platform.machine()})"


def _commit() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO_ROOT, capture_output=True, text=True).stdout
    return r.stdout.strip() + (" (+ uncommitted changes)" if dirty.strip() else "")


def _markdown(rows: list[list[str]], verdicts: list[str], args: argparse.Namespace, command: str) -> str:
    lines = [
        f"\n## {time.strftime('%Y-%m-%d %H:%M')} gateway overhead (SyntheticEngine vs Starlette ceiling)\n",
        f"- machine: {_machine()}; Python {platform.python_version()}; load generator in its own process on the same machine",
        f"- commit: {_commit()}",
        f"- command: `{command}`",
        f"- per point: {args.duration} s closed loop; prompts {args.input_tokens} tokens, streamed outputs "
        f"{args.output_tokens} tokens, non-streamed {args.nostream_output_tokens}; engine step delay {args.step_delay_ms} ms\n",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
        *(f"- {v}" for v in verdicts),
        "",
    ]
    return "\n".join(lines)


def _profile(tokenizer: str, args: argparse.Namespace, c: int) -> Path:
    """Run the gateway under py-spy (all threads, 200 Hz) for one streaming point; return the profile."""
    RESULTS_DIR.mkdir(exist_ok=True)
    out = RESULTS_DIR / f"overhead-profile-c{c}-{time.strftime('%Y%m%d-%H%M%S')}.txt"
    wrap = ["py-spy", "record", "--format", "raw", "--rate", "200", "--threads", "-o", str(out), "--"]
    env = {"BENCH_TOKENIZER": tokenizer, "BENCH_STEP_DELAY": str(args.step_delay_ms / 1000)}
    server = Server("benchmarks.overhead:gateway_app", factory=True, env=env, wrap=wrap)
    try:
        server.wait_ready()
        run_load_generator(_client_argv(server.base_url, tokenizer, c, args.duration, args.input_tokens,
                                        args.output_tokens, True))
    finally:
        server.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", help="tokenizer folder (default: the demo model's)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per point")
    p.add_argument("--concurrency", default="1,64,256", help="streamed concurrencies, comma list")
    p.add_argument("--input-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=128, help="tokens (= SSE events) per streamed request")
    p.add_argument("--nostream-output-tokens", type=int, default=16)
    p.add_argument("--step-delay-ms", type=float, default=0.0, help="SyntheticEngine step time (0: as fast as possible)")
    p.add_argument("--no-sse-starlette", dest="sse_starlette", action="store_false",
                   help="skip the second ceiling variant built on sse-starlette")
    p.add_argument("--profile", action="store_true", help="afterwards py-spy the gateway at the top concurrency")
    p.add_argument("--append-results", action="store_true", help=f"append a dated section to {RESULTS_MD}")
    args = p.parse_args(argv)
    command = "python -m benchmarks.overhead " + shlex.join(sys.argv[1:] if argv is None else argv)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    from benchmarks.tokenizer_source import default_tokenizer_path

    tokenizer = args.tokenizer or default_tokenizer_path()
    console = Console()
    delay = str(args.step_delay_ms / 1000)
    gateway = Server("benchmarks.overhead:gateway_app", factory=True, env={"BENCH_TOKENIZER": tokenizer, "BENCH_STEP_DELAY": delay})
    ceiling = Server("benchmarks.ceiling_app:app", env={"BENCH_CEILING_STEP_DELAY": delay})
    servers = [("gateway", gateway), ("ceiling", ceiling)]
    if args.sse_starlette:
        sse = Server("benchmarks.ceiling_app:app", env={"BENCH_CEILING_STEP_DELAY": delay}, prefix="/sse")
        servers.append(("ceiling-sse-starlette", sse))
    results: dict[tuple[str, str], dict[str, Any]] = {}
    rows: list[list[str]] = []
    try:
        for _, server in servers:
            server.wait_ready()
            # warm up (imports, caches, connection handling) before any measured point
            run_load_generator(_client_argv(server.base_url, tokenizer, 32, 0, args.input_tokens, 16, True, num_requests=128))
        points = [(f"stream c={c}", c, True) for c in concurrencies] + [("no-stream c=1", 1, False)]
        for test, c, stream in points:
            # servers interleaved per point, so drift in the machine's background load hits both alike
            for name, server in servers:
                out = args.output_tokens if stream else args.nostream_output_tokens
                console.print(f"[dim]{test} -> {name} ({args.duration:.0f} s)[/dim]")
                s = _measure(server, _client_argv(server.base_url, tokenizer, c, args.duration, args.input_tokens, out, stream))
                results[(test, name)] = s
                rows.append(_row(test, name, s))
    finally:
        for _, server in servers:
            server.stop()

    table = Table(title="gateway overhead", title_justify="left")
    for col in COLUMNS:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(*r)
    console.print(table)
    verdicts = _verdicts(results, concurrencies)
    for v in verdicts:
        console.print(v)
    if args.append_results:
        with RESULTS_MD.open("a") as f:
            f.write(_markdown(rows, verdicts, args, command))
        console.print(f"appended to {RESULTS_MD}")
    if args.profile:
        console.print(f"profile: {_profile(tokenizer, args, max(concurrencies))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
