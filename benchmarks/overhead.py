"""Gateway-overhead benchmark: our gateway over the SyntheticEngine (no model) against the stack's
ceiling (benchmarks/ceiling_app.py: bare Starlette + uvicorn emitting the same SSE events).

    python -m benchmarks.overhead                       # 10 s per point, 3 repeats, medians and ratios
    python -m benchmarks.overhead --append-results      # also appends a dated section to RESULTS.md
    python -m benchmarks.overhead --profile             # also py-spy the warm gateway (top c, no-stream c=1)

Each server runs in its own uvicorn process on a free loopback port; the load generator runs in
another process. On a 2-core machine the client (Python, httpx) needs about as much CPU as the
server, so absolute events/s are client-bound at high concurrency; the server's CPU time per event
(read from /proc) is the figure that does not depend on the client, and it is reported too.
Every point is measured --repeat times, the servers interleaved (so drift in a shared machine's load
hits them alike); the table shows medians, and each ratio is the median of the per-repeat ratios.

Targets (issue #5): streamed events/s >= 0.5 x the raw ceiling, and < 2 ms added p50 latency for a
non-streamed request at concurrency 1.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.procs import REPO_ROOT, Server, run_load_generator
from benchmarks.profile_summary import summarise

RESULTS_MD = Path(__file__).parent / "RESULTS.md"
RESULTS_DIR = Path(__file__).parent / "results"


def gateway_app() -> Any:
    """uvicorn factory: our gateway over a SyntheticEngine (BENCH_TOKENIZER, BENCH_STEP_DELAY, BENCH_EXECUTOR
    from env)."""
    from benchmarks.synthetic_engine import SyntheticEngine
    from gateway.app import create_app
    from gateway.settings import Settings
    from runtime.config import EngineConfig

    tokenizer = os.environ["BENCH_TOKENIZER"]
    engine = SyntheticEngine(tokenizer, step_delay=float(os.environ.get("BENCH_STEP_DELAY", "0")),
                             threaded=os.environ.get("BENCH_EXECUTOR", "thread") == "thread")
    settings = Settings(log_level="warning", grpc_port=None, engine=EngineConfig(served_model_name="synthetic", tokenizer=tokenizer))
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


def _figures(s: dict[str, Any]) -> dict[str, float]:
    """The scalar figures of one measurement that the table shows."""
    units = s["events_per_s"] * s["duration_s"] if s["events_per_s"] else s["completed"]  # per event, or per request
    return {
        "events_per_s": s["events_per_s"], "req_per_s": s["request_throughput"],
        "cpu_us_per_unit": s["server_cpu_s"] / max(units, 1) * 1e6,
        "srv_cpu": s["server_cpu_s"] / s["duration_s"], "client_cpu": s["client_cpu_s"] / s["duration_s"],
        "ttft_p50": _p50(s, "ttft_ms"), "itl_p50": _p50(s, "itl_ms"), "e2e_p50": _p50(s, "e2e_ms"),
        "e2e_p99": s["e2e_ms"]["p99"] if s["e2e_ms"] else float("nan"), "failed": s["failed"],
    }


def _median(runs: list[dict[str, Any]]) -> dict[str, float]:
    figs = [_figures(s) for s in runs]
    out = {k: statistics.median(f[k] for f in figs) for k in figs[0]}
    out["failed"] = sum(f["failed"] for f in figs)
    return out


def _row(test: str, name: str, m: dict[str, float]) -> list[str]:
    return [
        test, name, f"{m['events_per_s']:.0f}", f"{m['req_per_s']:.1f}", f"{m['cpu_us_per_unit']:.0f}",
        f"{100 * m['srv_cpu']:.0f}%", f"{100 * m['client_cpu']:.0f}%", f"{m['ttft_p50']:.2f}", f"{m['itl_p50']:.3f}",
        f"{m['e2e_p50']:.2f}", f"{m['e2e_p99']:.2f}", str(int(m["failed"])),
    ]


COLUMNS = ["test", "server", "events/s", "req/s", "srv CPU µs/event (µs/req)", "srv CPU", "client CPU",
           "TTFT p50 ms", "ITL p50 ms", "E2E p50 ms", "E2E p99 ms", "failed"]
Results = dict[tuple[str, str], list[dict[str, Any]]]


def _ratios(results: Results, test: str, fn: Any) -> list[float]:
    """fn(gateway run, ceiling run) for each repeat (the two were measured back to back)."""
    return [fn(_figures(g), _figures(c)) for g, c in zip(results[(test, "gateway")], results[(test, "ceiling")])]


def _verdicts(results: Results, concurrencies: list[int]) -> list[str]:
    med = statistics.median
    lines = []
    for c in concurrencies:
        test = f"stream c={c}"
        ratios = _ratios(results, test, lambda g, b: g["events_per_s"] / b["events_per_s"])
        cpu = med(_ratios(results, test, lambda g, b: b["cpu_us_per_unit"] / g["cpu_us_per_unit"]))
        ttft = med(_ratios(results, test, lambda g, b: g["ttft_p50"] - b["ttft_p50"]))
        e2e = med(_ratios(results, test, lambda g, b: g["e2e_p50"] - b["e2e_p50"]))
        ratio = med(ratios)
        lines.append(
            f"stream c={c}: events/s gateway/ceiling = {ratio:.2f} (runs: {', '.join(f'{r:.2f}' for r in ratios)}; "
            f"{'PASS' if ratio >= 0.5 else 'FAIL'}, target >= 0.5); server CPU per event ceiling/gateway = {cpu:.2f}; "
            f"added TTFT p50 = {ttft:+.2f} ms, added E2E p50 = {e2e:+.2f} ms"
        )
    added_runs = _ratios(results, "no-stream c=1", lambda g, b: g["e2e_p50"] - b["e2e_p50"])
    added = med(added_runs)
    lines.append(f"no-stream c=1: added p50 latency = {added:+.2f} ms (runs: {', '.join(f'{a:+.2f}' for a in added_runs)}; "
                 f"{'PASS' if added < 2.0 else 'FAIL'}, target < 2 ms)")
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


def _markdown(rows: list[list[str]], verdicts: list[str], args: argparse.Namespace, command: str,
              load: tuple[float, float]) -> str:
    lines = [
        f"\n## {time.strftime('%Y-%m-%d %H:%M')} gateway overhead (SyntheticEngine vs Starlette ceiling)\n",
        f"- machine: {_machine()}; Python {platform.python_version()}; load generator in its own process on the same machine",
        f"- load average (1 min) at start / end: {load[0]:.1f} / {load[1]:.1f} (other processes share the cores)",
        f"- commit: {_commit()}",
        f"- command: `{command}`",
        f"- per point: {args.duration} s closed loop, {args.repeat} repeats (table: medians); prompts {args.input_tokens} "
        f"tokens, streamed outputs {args.output_tokens} tokens, non-streamed {args.nostream_output_tokens}; "
        f"SyntheticEngine steps {'on the event loop' if args.executor == 'loop' else 'in a thread'}, step delay "
        f"{args.step_delay_ms} ms\n",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
        *(f"- {v}" for v in verdicts),
        "",
    ]
    return "\n".join(lines)


def _profile(server: Server, tokenizer: str, args: argparse.Namespace, c: int, stream: bool) -> Path:
    """py-spy the (warm) gateway process while one load point runs; return the raw profile."""
    RESULTS_DIR.mkdir(exist_ok=True)
    out = RESULTS_DIR / f"overhead-profile-{'stream' if stream else 'nostream'}-c{c}-{time.strftime('%Y%m%d-%H%M%S')}.txt"
    spy = subprocess.Popen(["py-spy", "record", "--format", "raw", "--rate", "200", "--threads", "--nonblocking",
                            "--pid", str(server.server_pid), "-o", str(out)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        out_tokens = args.output_tokens if stream else args.nostream_output_tokens
        run_load_generator(_client_argv(server.base_url, tokenizer, c, args.duration, args.input_tokens, out_tokens,
                                        stream))
    finally:
        spy.send_signal(2)  # SIGINT: py-spy writes the profile and exits
        spy.wait(timeout=60)
    return out


def _print_profile(console: Console, path: Path, top: int = 12) -> None:
    total, self_c, _ = summarise(str(path), "MainThread")
    console.print(f"profile {path} (event-loop thread, {total} samples), top by self time:")
    for frame, n in self_c.most_common(top):
        console.print(f"  {100 * n / max(total, 1):5.1f}%  {frame}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", help="tokenizer folder (default: the demo model's)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per point")
    p.add_argument("--repeat", type=int, default=3, help="measurements per point (medians are reported)")
    p.add_argument("--concurrency", default="1,64,256", help="streamed concurrencies, comma list")
    p.add_argument("--input-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=128, help="tokens (= SSE events) per streamed request")
    p.add_argument("--nostream-output-tokens", type=int, default=16)
    p.add_argument("--step-delay-ms", type=float, default=0.0, help="SyntheticEngine step time (0: as fast as possible)")
    p.add_argument("--executor", choices=["thread", "loop"], default="thread",
                   help="SyntheticEngine steps in a thread like the native engine (default), or on the event loop "
                        "(one step per loop iteration: no thread hand-over, no run-ahead)")
    p.add_argument("--no-sse-starlette", dest="sse_starlette", action="store_false",
                   help="skip the second ceiling variant built on sse-starlette")
    p.add_argument("--profile", action="store_true",
                   help="afterwards py-spy the warm gateway at the top concurrency and at no-stream c=1")
    p.add_argument("--append-results", action="store_true", help=f"append a dated section to {RESULTS_MD}")
    args = p.parse_args(argv)
    command = "python -m benchmarks.overhead " + shlex.join(sys.argv[1:] if argv is None else argv)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    from benchmarks.tokenizer_source import default_tokenizer_path

    tokenizer = args.tokenizer or default_tokenizer_path()
    console = Console(width=200)
    load_start = os.getloadavg()[0]
    delay = str(args.step_delay_ms / 1000)
    gateway = Server("benchmarks.overhead:gateway_app", factory=True,
                     env={"BENCH_TOKENIZER": tokenizer, "BENCH_STEP_DELAY": delay, "BENCH_EXECUTOR": args.executor})
    ceiling = Server("benchmarks.ceiling_app:app", env={"BENCH_CEILING_STEP_DELAY": delay})
    servers = [("gateway", gateway), ("ceiling", ceiling)]
    if args.sse_starlette:
        sse = Server("benchmarks.ceiling_app:app", env={"BENCH_CEILING_STEP_DELAY": delay}, prefix="/sse")
        servers.append(("ceiling-sse-starlette", sse))
    results: Results = {}
    profiles: list[Path] = []
    try:
        for _, server in servers:
            server.wait_ready()
            # warm up (imports, caches, connection handling) before any measured point
            run_load_generator(_client_argv(server.base_url, tokenizer, 32, 0, args.input_tokens, 16, True, num_requests=128))
        points = [(f"stream c={c}", c, True) for c in concurrencies] + [("no-stream c=1", 1, False)]
        for test, c, stream in points:
            for rep in range(args.repeat):
                # servers interleaved per repeat, so drift in the machine's background load hits both alike
                for name, server in servers:
                    out = args.output_tokens if stream else args.nostream_output_tokens
                    console.print(f"[dim]{test} -> {name} ({args.duration:.0f} s, run {rep + 1}/{args.repeat})[/dim]")
                    s = _measure(server, _client_argv(server.base_url, tokenizer, c, args.duration, args.input_tokens,
                                                      out, stream))
                    results.setdefault((test, name), []).append(s)
        if args.profile:
            profiles = [_profile(gateway, tokenizer, args, max(concurrencies), True),
                        _profile(gateway, tokenizer, args, 1, False)]
    finally:
        for _, server in servers:
            server.stop()
    load = (load_start, os.getloadavg()[0])

    rows = [_row(test, name, _median(runs)) for (test, name), runs in results.items()]
    table = Table(title="gateway overhead (medians)", title_justify="left")
    for col in COLUMNS:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(*r)
    console.print(table)
    verdicts = _verdicts(results, concurrencies)
    for v in verdicts:
        console.print(v)
    console.print(f"load average (1 min) at start / end: {load[0]:.1f} / {load[1]:.1f}")
    if args.append_results:
        with RESULTS_MD.open("a") as f:
            f.write(_markdown(rows, verdicts, args, command, load))
        console.print(f"appended to {RESULTS_MD}")
    for path in profiles:
        _print_profile(console, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
