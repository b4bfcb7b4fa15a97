"""Load generator for OpenAI-compatible and Triton generate endpoints.

    python -m benchmarks.serve --base-url http://127.0.0.1:8000 --api completions --concurrency 8
    python -m benchmarks.serve --api chat --request-rate 4 --num-prompts 200 --goodput ttft:500 tpot:50
    python -m benchmarks.serve --sweep-concurrency 1,8,32 --duration 15   # writes PNGs to benchmarks/results/

Reports request and token throughput, TTFT, TPOT, ITL and end-to-end latency (mean, p50, p90, p99),
errors and goodput; `--json FILE` writes the same as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from benchmarks.backends import API_KINDS, RequestResult, Target
from benchmarks.dataset import Prompt, jsonl_prompts, load_tokenizer, synthetic_prompts
from benchmarks.load import LoadSpec, run_load, run_load_processes
from benchmarks.metrics import Goodput, summarize
from benchmarks.report import plot_sweep, print_summary, print_sweep, write_json

RESULTS_DIR = Path(__file__).parent / "results"


class TokenCounter:
    """Tokens of a text (a class, not a lambda: client processes get it pickled)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __call__(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("target")
    g.add_argument("--base-url", default="http://127.0.0.1:8000",
                   help="the server's HTTP address (default: %(default)s)")
    g.add_argument("--api", choices=API_KINDS, default="completions",
                   help="completions, chat, triton (/v2/models/{m}/generate[_stream]) or triton-grpc (ModelStreamInfer)")
    g.add_argument("--grpc-url", help="host:port of the KServe v2 gRPC service (default: the base URL's host, port 8001)")
    g.add_argument("--model", help="model name (default: the first one GET /v1/models lists)")
    g.add_argument("--api-key", help="sent as 'Authorization: Bearer ...'")
    g.add_argument("--no-stream", dest="stream", action="store_false", help="non-streamed requests (no TTFT/ITL)")
    g.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false", help="do not send ignore_eos (output lengths then vary)")
    g.add_argument("--extra-body", type=json.loads, default={}, help="JSON object merged into every request body")
    g = p.add_argument_group("prompts")
    g.add_argument("--tokenizer", help="tokenizer folder (default: the demo model's)")
    g.add_argument("--dataset", help="JSONL file of {\"prompt\": ..., \"max_tokens\": ...} (default: synthetic)")
    g.add_argument("--num-prompts", type=int, default=200, help="distinct prompts; also the number of requests unless --num-requests/--duration")
    g.add_argument("--input-mean", type=float, default=128,
                   help="synthetic prompts' mean length in tokens (default: %(default)s)")
    g.add_argument("--input-std", type=float, default=5, help="their standard deviation (default: %(default)s)")
    g.add_argument("--output-mean", type=float, default=20,
                   help="mean max_tokens asked per request (default: %(default)s)")
    g.add_argument("--output-std", type=float, default=2, help="its standard deviation (default: %(default)s)")
    g.add_argument("--seed", type=int, default=0,
                   help="seed of the synthetic prompts and lengths (default: %(default)s)")
    g = p.add_argument_group("load")
    g.add_argument("--concurrency", type=int, default=None, help="requests in flight (closed loop; default 1), or the cap with --request-rate")
    g.add_argument("--request-rate", type=float, default=None, help="Poisson arrivals per second (default: closed loop)")
    g.add_argument("--num-requests", type=int, help="requests to send (prompts are cycled)")
    g.add_argument("--duration", type=float, help="seconds to keep starting requests (prompts are cycled)")
    g.add_argument("--warmup", type=int, default=4, help="requests sent before measuring")
    g.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, seconds")
    g.add_argument("--client-processes", type=int, default=1,
                   help="split the load over this many client processes (one saturates near 30k events/s)")
    g.add_argument("--sweep-concurrency", help="comma list, e.g. 1,8,32: one run each, plus a PNG plot")
    g.add_argument("--sweep-rate", help="comma list of request rates: one run each, plus a PNG plot")
    g = p.add_argument_group("output")
    g.add_argument("--goodput", nargs="+", default=[], metavar="KEY:MS", help="latency targets: ttft:MS tpot:MS e2e:MS")
    g.add_argument("--json", dest="json_path", help="write the results to this JSON file")
    g.add_argument("--results-dir", default=str(RESULTS_DIR), help="where sweep plots (and sweep JSON) go")
    g.add_argument("--label", default="", help="a name for this run in titles and file names")
    g.add_argument("--quiet", action="store_true", help="no progress bar or tables (for scripts)")
    return p


def _detect_model(args: argparse.Namespace, headers: dict[str, str]) -> str:
    try:
        r = httpx.get(args.base_url.rstrip("/") + "/v1/models", headers=headers, timeout=10)
        r.raise_for_status()
        return r.json()["data"][0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
        raise SystemExit(f"cannot list models at {args.base_url}/v1/models ({e}); pass --model") from None


def _prompts(args: argparse.Namespace, tokenizer: Any) -> list[Prompt]:
    if args.dataset:
        return jsonl_prompts(args.dataset, args.num_prompts, round(args.output_mean), tokenizer)
    return synthetic_prompts(
        tokenizer, args.num_prompts, args.input_mean, args.input_std, args.output_mean, args.output_std, args.seed
    )


def _run_point(target: Target, prompts: list[Prompt], spec: LoadSpec, console: Console, quiet: bool, label: str,
               processes: int = 1) -> tuple[list[RequestResult], float, float]:
    if processes > 1:
        return run_load_processes(target, prompts, spec, processes)
    if quiet:
        return asyncio.run(run_load(target, prompts, spec))
    total = spec.duration_s if spec.duration_s else (spec.num_requests or len(prompts))
    unit = "s" if spec.duration_s else "requests"
    columns = [TextColumn(f"{label} ({unit})"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[failed]} failed")]
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(label, total=round(total), failed=0)
        started = time.perf_counter()
        failed = 0

        def on_result(r: RequestResult) -> None:
            nonlocal failed
            failed += not r.ok
            done = min(round(time.perf_counter() - started), round(total)) if spec.duration_s else None
            if done is None:
                progress.advance(task)
                progress.update(task, failed=failed)
            else:
                progress.update(task, completed=done, failed=failed)

        return asyncio.run(run_load(target, prompts, spec, on_result))


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m benchmarks.serve`; returns the exit code."""
    args = build_parser().parse_args(argv)
    console = Console(stderr=args.quiet)
    goodput = Goodput.parse(args.goodput)
    if not args.stream and (goodput.ttft_ms is not None or goodput.tpot_ms is not None):
        raise SystemExit("ttft and tpot goodput targets need streamed requests; with --no-stream use e2e:MS")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    model = args.model or _detect_model(args, headers)

    from benchmarks.tokenizer_source import default_tokenizer_path

    tokenizer = None
    if not args.dataset or args.api.startswith("triton") or args.tokenizer:
        tokenizer = load_tokenizer(args.tokenizer or default_tokenizer_path())
    prompts = _prompts(args, tokenizer)
    target = Target(
        base_url=args.base_url, api=args.api, model=model, stream=args.stream, ignore_eos=args.ignore_eos,
        extra_body=args.extra_body, headers=headers, grpc_url=args.grpc_url or f"{urlsplit(args.base_url).hostname}:8001",
        count_tokens=TokenCounter(tokenizer) if tokenizer else None,
    )

    sweep_key, sweep_values = None, [None]
    if args.sweep_concurrency:
        sweep_key, sweep_values = "concurrency", [int(v) for v in args.sweep_concurrency.split(",")]
    elif args.sweep_rate:
        sweep_key, sweep_values = "rate", [float(v) for v in args.sweep_rate.split(",")]

    points = []
    for value in sweep_values:
        concurrency = value if sweep_key == "concurrency" else args.concurrency
        rate = value if sweep_key == "rate" else args.request_rate
        spec = LoadSpec(
            concurrency=concurrency if (concurrency or rate) else 1, rate=rate, num_requests=args.num_requests,
            duration_s=args.duration, warmup=args.warmup, seed=args.seed, timeout_s=args.timeout,
        )
        label = f"{args.api} {'stream' if args.stream else 'no-stream'} " + (
            f"rate={rate}/s" if rate else f"concurrency={spec.concurrency}"
        )
        results, duration, client_cpu = _run_point(target, prompts, spec, console, args.quiet, label,
                                                   args.client_processes)
        summary = summarize(results, duration, goodput)
        summary["client_cpu_s"] = client_cpu
        points.append({"concurrency": spec.concurrency, "rate": rate, "summary": summary})
        if not args.quiet:
            print_summary(console, summary, f"{args.label + ': ' if args.label else ''}{label} -> {args.base_url}")

    payload = {
        "base_url": args.base_url, "api": args.api, "model": model, "stream": args.stream,
        "argv": sys.argv[1:] if argv is None else argv, "points": points,
    }
    if sweep_key:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name = f"{args.label or 'sweep'}-{args.api}-{sweep_key}-{stamp}"
        png = plot_sweep(points, sweep_key, Path(args.results_dir) / f"{name}.png", f"{args.label or args.base_url}: {args.api}, sweep over {sweep_key}")
        write_json(Path(args.results_dir) / f"{name}.json", payload)
        if not args.quiet:
            print_sweep(console, points, sweep_key, f"sweep over {sweep_key}")
            console.print(f"plot: {png}")
    if args.json_path:
        write_json(args.json_path, payload)
    return 1 if all(p["summary"]["completed"] == 0 for p in points) else 0


if __name__ == "__main__":
    sys.exit(main())
