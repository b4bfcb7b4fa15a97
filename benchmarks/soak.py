"""Bounded soak test: the gateway on the demo model under a mix of streamed, non-streamed and aborted
requests (OpenAI and Triton dialects, Triton's over HTTP and KServe gRPC) at fixed concurrency, on loopback, for
a few minutes.

    python -m benchmarks.soak --duration 180 --warmup 30 --concurrency 64 [--hostile] [--append-results]

Passes (exit 0) when: no request failed except those the script aborts on purpose; every completed
request has exactly the tokens it asked for (ignore_eos); the server answered no 5xx; after the load
the server holds no KV blocks and no requests (read from /metrics); the server's resident memory grew
less than 10% from the end of the warm-up to the end (psutil: the server's process and its engine core); and SIGTERM then
drains the idle server and it exits 0. `--hostile` mixes in benchmarks.hostile's requests, HTTP and gRPC (any
answer but a 5xx or a gRPC server error is right for those) and reports the non-streamed p99 per third of the
run. `--append-results` adds a dated section to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import psutil

from benchmarks.hostile import HOSTILE, is_server_error
from benchmarks.hostile_grpc import GRPC_HOSTILE, call_stream, call_unary, infer_request
from benchmarks.procs import REPO_ROOT, Server, free_port

KINDS = {  # kind -> weight; "abort_*" are the provoked failures
    "completion": 2, "completion_stream": 2, "chat": 2, "chat_stream": 2, "triton": 1, "triton_stream": 1,
    "grpc": 1, "grpc_stream": 1, "abort_stream": 1, "abort_wait": 1,
}
WORDS = "the cat sat on a mat while dogs ran over green hills and the sun set behind old towers".split()
MAX_RSS_GROWTH = 0.10
HOSTILE_WEIGHT = 1  # with --hostile: one request in 16 comes from benchmarks.hostile's mix


@dataclass
class Tally:
    """What the clients saw."""

    done: Counter = field(default_factory=Counter)  # kind -> requests completed as expected
    errors: Counter = field(default_factory=Counter)  # "kind: what" -> count
    output_tokens: int = 0
    finished_at: list[tuple[float, int]] = field(default_factory=list)  # (time, output tokens) per request
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (time, seconds) per non-streamed request
    hostile: Counter = field(default_factory=Counter)  # "name status" -> count


def _body(rng: random.Random, model: str, max_tokens: int, kind: str) -> tuple[str, dict[str, Any]]:
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 60)))
    sampling = {"max_tokens": max_tokens, "temperature": rng.choice([0.0, 0.8])}
    if kind.startswith("triton"):  # Triton's generate has no ignore_eos: only the text is checked
        return (f"/v2/models/{model}/generate" + ("_stream" if kind.endswith("stream") else ""),
                {"text_input": prompt, "stream": kind.endswith("stream"), **sampling})
    sampling["ignore_eos"] = True
    if kind.startswith("chat"):
        return "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": prompt}],
                                        **sampling}
    return "/v1/completions", {"model": model, "prompt": prompt, **sampling}


def _events(lines: list[str]) -> list[Any]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


async def hostile_request(client: httpx.AsyncClient, channel: grpc.aio.Channel, rng: random.Random,
                          bodies: dict[str, tuple[str, bytes]], tally: Tally) -> None:
    """One request of benchmarks.hostile's mix, HTTP or gRPC: any answer but a 5xx or a gRPC server error (or a
    dropped connection) is right."""
    name = rng.choice(sorted([*bodies, *GRPC_HOSTILE]))
    if name in GRPC_HOSTILE:
        status = await GRPC_HOSTILE[name](channel)
    else:
        path, body = bodies[name]
        try:
            status = str((await client.post(path, content=body, headers={"content-type": "application/json"}))
                         .status_code)
        except httpx.HTTPError as exc:
            tally.errors[f"hostile {name}: {type(exc).__name__}"] += 1
            return
    tally.hostile[f"{name} {status}"] += 1
    if is_server_error(f"{name} {status}"):
        tally.errors[f"hostile {name}: status {status}"] += 1


async def grpc_request(channel: grpc.aio.Channel, prompt: str, want: int, streamed: bool) -> str | None:
    """A Triton request over gRPC (ModelInfer, or ModelStreamInfer with one response per delta): what went wrong."""
    message = infer_request({"text_input": prompt, "max_tokens": want, "stream": streamed})
    try:
        if not streamed:
            response = await call_unary(channel, message)
            return None if [o.name for o in response.outputs][:1] == ["text_output"] else "no text_output"
        responses = await call_stream(channel, [message])
    except grpc.aio.AioRpcError as exc:
        return f"status {exc.code().name}"
    if any(r.error_message for r in responses):
        return "error response"
    final = responses[-1].infer_response.parameters["triton_final_response"].bool_param if responses else False
    return None if final else "no final response"


async def one_request(client: httpx.AsyncClient, channel: grpc.aio.Channel, rng: random.Random, model: str,
                      max_tokens: int, tally: Tally, hostile: dict[str, tuple[str, bytes]]) -> None:
    weights = {**KINDS, "hostile": HOSTILE_WEIGHT if hostile else 0}
    kind = rng.choices(list(weights), weights=list(weights.values()))[0]
    if kind == "hostile":
        await hostile_request(client, channel, rng, hostile, tally)
        return
    want = rng.randint(4, max_tokens)
    if kind.startswith("grpc"):  # Triton's dialect over gRPC: only the answer's shape is checked, as over HTTP
        start = time.perf_counter()
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 60)))
        problem = await grpc_request(channel, prompt, want, kind == "grpc_stream")
        if kind == "grpc":
            tally.latencies.append((time.monotonic(), time.perf_counter() - start))
        if problem:
            tally.errors[f"{kind}: {problem}"] += 1
            return
        tally.done[kind] += 1
        tally.finished_at.append((time.monotonic(), 0))
        return
    streamed = kind.endswith("stream")
    path, body = _body(rng, model, want if kind != "abort_wait" else max_tokens * 4,
                       "completion_stream" if kind == "abort_stream" else kind)
    if streamed and not kind.startswith("triton"):
        body.update(stream=True, stream_options={"include_usage": True})
    try:
        if kind == "abort_wait":  # the client gives up while the server generates: it must abort
            try:
                r = await asyncio.wait_for(client.post(path, json=body), rng.uniform(0.05, 0.5))
            except asyncio.TimeoutError:
                tally.done[kind] += 1
                return
            problem = None if r.status_code == 200 else f"status {r.status_code}"
        elif streamed:
            async with client.stream("POST", path, json=body) as r:
                lines: list[str] = []
                async for line in r.aiter_lines():
                    if line:
                        lines.append(line)
                    if kind == "abort_stream" and len(lines) >= 2:
                        break  # closes the connection mid-stream
            problem = _check_stream(kind, r.status_code, lines, want)
        else:
            start = time.perf_counter()
            r = await client.post(path, json=body)
            tally.latencies.append((time.monotonic(), time.perf_counter() - start))
            problem = _check_json(kind, r, want)
    except httpx.HTTPError as exc:
        problem = type(exc).__name__
    if problem:
        tally.errors[f"{kind}: {problem}"] += 1
        return
    tally.done[kind] += 1
    tokens = 0 if kind.startswith("abort") or kind.startswith("triton") else want
    tally.output_tokens += tokens
    tally.finished_at.append((time.monotonic(), tokens))


def _check_stream(kind: str, status: int, lines: list[str], want: int) -> str | None:
    if status != 200:
        return f"status {status}"
    events = _events(lines)
    if any("error" in e for e in events):
        return "error event"
    if kind == "abort_stream":
        return None
    if kind == "triton_stream":
        return None if events and all("text_output" in e for e in events) else "malformed events"
    if lines[-1] != "data: [DONE]":
        return "no [DONE]"
    usage = events[-1].get("usage") or {}
    return None if usage.get("completion_tokens") == want else f"completion_tokens {usage.get('completion_tokens')}"


def _check_json(kind: str, r: httpx.Response, want: int) -> str | None:
    if r.status_code != 200:
        return f"status {r.status_code}"
    body = r.json()
    if kind == "triton":
        return None if isinstance(body.get("text_output"), str) else "no text_output"
    got = body["usage"]["completion_tokens"]
    return None if got == want else f"completion_tokens {got}"


async def drive(url: str, grpc_address: str, model: str, args: argparse.Namespace, tally: Tally,
                stop_at: float) -> None:
    limits = httpx.Limits(max_connections=args.concurrency + 8, max_keepalive_connections=args.concurrency)
    hostile = {name: make(model) for name, make in HOSTILE.items()} if args.hostile else {}
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client, \
            grpc.aio.insecure_channel(grpc_address) as channel:
        async def worker(i: int) -> None:
            rng = random.Random(args.seed * 1000 + i)
            while time.monotonic() < stop_at:
                await one_request(client, channel, rng, model, args.max_tokens, tally, hostile)

        await asyncio.gather(*(worker(i) for i in range(args.concurrency)))


def tree_rss(proc: psutil.Process) -> tuple[int, int]:
    """(resident bytes of the server's processes: the front end and its engine core, of the front end alone)."""
    front = proc.memory_info().rss
    total = front
    for child in proc.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total, front


async def sample_rss(proc: psutil.Process, samples: list[tuple[float, int, int]], stop: asyncio.Event) -> None:
    while not stop.is_set():
        samples.append((time.monotonic(), *tree_rss(proc)))
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except asyncio.TimeoutError:
            pass


def scrape(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for s in family.samples:
            key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}" if s.labels else "")
            out[key] = s.value
    return out


def wait_idle(url: str, timeout: float = 30.0) -> dict[str, float]:
    """/metrics once no request runs or waits and no KV block is used (or after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(url)
        idle = all(m[f"trtllm_gateway_{n}"] == 0 for n in ("kv_blocks_used", "requests_running", "requests_waiting",
                                                            "requests_paused"))
        if idle or time.monotonic() > deadline:
            return m
        time.sleep(0.25)


def run(args: argparse.Namespace) -> dict[str, Any]:
    # the demo model unless --server-arg names another (a later --model wins)
    grpc_port = free_port()
    command = [sys.executable, "-m", "gateway", "serve", "--port", "{port}", "--grpc-port", str(grpc_port),
               "--dtype", "float32", "--log-level", "warning", "--drain-timeout", "30", "--model", "demo",
               *args.server_arg]
    server = Server("", command=command, ready_path="/health")
    try:
        server.wait_ready()
        url = server.base_url
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        proc = psutil.Process(server.proc.pid)
        tally, samples = Tally(), []
        started = time.monotonic()

        async def main() -> None:
            stop = asyncio.Event()
            sampler = asyncio.create_task(sample_rss(proc, samples, stop))
            await drive(url, f"127.0.0.1:{grpc_port}", model, args, tally, started + args.duration)
            stop.set()
            await sampler

        asyncio.run(main())
        load_s = time.monotonic() - started
        metrics = wait_idle(url)
        end_rss, end_front = tree_rss(proc)
        server.proc.send_signal(15)  # SIGTERM on an idle server: drained at once, exit 0
        exit_code = server.proc.wait(60)
    finally:
        server.stop()
    warm = [(rss, front) for t, rss, front in samples if t <= started + args.warmup]
    baseline, front_baseline = warm[-1] if warm else samples[0][1:]
    thirds = [sum(n for t, n in tally.finished_at if started + k * load_s / 3 <= t < started + (k + 1) * load_s / 3)
              for k in range(3)]
    p99_by_third = [float(np.percentile(x, 99)) * 1e3 if (x := [d for t, d in tally.latencies
                                                                   if started + k * load_s / 3 <= t <
                                                                   started + (k + 1) * load_s / 3]) else 0.0
                    for k in range(3)]
    statuses: Counter = Counter()
    for key, value in metrics.items():  # trtllm_gateway_requests_total{endpoint=...,status=...}, probes left out
        if key.startswith("trtllm_gateway_requests_total{") and "endpoint=/health" not in key \
                and "endpoint=/metrics" not in key:
            statuses[key.split("status=")[1].rstrip("}")] += int(value)
    return {
        "load_s": round(load_s, 1), "requests": sum(tally.done.values()) + sum(tally.errors.values()),
        "done": dict(tally.done), "errors": dict(tally.errors),
        "provoked_aborts": tally.done["abort_stream"] + tally.done["abort_wait"],
        "output_tokens": tally.output_tokens, "output_tok_s": round(tally.output_tokens / load_s, 1),
        "output_tokens_by_third": thirds, "nonstreamed_p99_ms_by_third": [round(x, 1) for x in p99_by_third],
        "hostile": dict(sorted(tally.hostile.items())),
        "server_5xx": sum(n for status, n in statuses.items() if status.startswith("5")),
        "server_statuses": dict(statuses),
        "kv_blocks_used_end": metrics["trtllm_gateway_kv_blocks_used"],
        "requests_running_end": metrics["trtllm_gateway_requests_running"],
        "rss_start_mb": round(samples[0][1] / 2**20, 1), "rss_warm_mb": round(baseline / 2**20, 1),
        "rss_peak_mb": round(max(r for _, r, _ in samples) / 2**20, 1), "rss_end_mb": round(end_rss / 2**20, 1),
        "rss_growth": round(end_rss / baseline - 1, 4),
        "front_end_rss_warm_mb": round(front_baseline / 2**20, 1), "front_end_rss_end_mb": round(end_front / 2**20, 1),
        "exit_code": exit_code,
    }


def verdict(result: dict[str, Any]) -> list[str]:
    """Failed checks (empty: the soak passed)."""
    failed = []
    if result["errors"]:
        failed.append(f"unexpected errors: {result['errors']}")
    if result["server_5xx"]:
        failed.append(f"server answered {result['server_5xx']} 5xx")
    if result["kv_blocks_used_end"] or result["requests_running_end"]:
        failed.append("KV blocks or requests left at the end")
    if result["rss_growth"] >= MAX_RSS_GROWTH:
        failed.append(f"resident memory grew {result['rss_growth']:.1%} after warm-up")
    if result["exit_code"] != 0:
        failed.append(f"server exited {result['exit_code']} after SIGTERM")
    return failed


def results_section(result: dict[str, Any], args: argparse.Namespace, failed: list[str]) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                            text=True).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    r = result
    third = r["output_tokens_by_third"]
    rows = [
        ("requests (completed as asked / unexpected errors)", f"{r['requests'] - sum(r['errors'].values())} / "
                                                               f"{sum(r['errors'].values())}"),
        ("of which provoked aborts (stream dropped / client timeout)",
         f"{r['done'].get('abort_stream', 0)} / {r['done'].get('abort_wait', 0)}"),
        ("server statuses (requests_total, probes and scrapes left out)",
         ", ".join(f"{k}: {v}" for k, v in sorted(r["server_statuses"].items()))),
        ("OpenAI output tok/s over the run", f"{r['output_tok_s']}"),
        ("output tokens, last third / first third", f"{third[2] / max(third[0], 1):.2f}"),
        ("non-streamed latency p99 ms by third (drift: last / first)",
         f"{' / '.join(map(str, r['nonstreamed_p99_ms_by_third']))} "
         f"({r['nonstreamed_p99_ms_by_third'][2] / max(r['nonstreamed_p99_ms_by_third'][0], 1e-9):.2f}x)"),
        ("hostile requests by answer", ", ".join(f"{k}: {v}" for k, v in r["hostile"].items()) or "none sent"),
        ("KV blocks used / requests running at the end", f"{r['kv_blocks_used_end']:.0f} / "
                                                          f"{r['requests_running_end']:.0f}"),
        ("server RSS MB (front end + engine core): start / after warm-up / peak / end", f"{r['rss_start_mb']} / {r['rss_warm_mb']} / "
                                                               f"{r['rss_peak_mb']} / {r['rss_end_mb']}"),
        ("RSS growth after warm-up (end / after warm-up - 1)", f"{r['rss_growth']:+.1%} (limit +10%)"),
        ("front end alone, RSS MB after warm-up / end", f"{r['front_end_rss_warm_mb']} / {r['front_end_rss_end_mb']}"),
        ("exit code after SIGTERM", str(r["exit_code"])),
    ]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    argv = " ".join(sys.argv[1:])
    return (f"\n## {datetime.now(timezone.utc):%Y-%m-%d %H:%M} soak: mixed streamed / non-streamed / aborted, "
            f"c={args.concurrency}, {args.duration:g} s (demo model, CPU)\n\n"
            f"- machine: {cpu}, {psutil.cpu_count()} CPUs, shared with other engineers' tests (timings are noisy)\n"
            f"- commit: {commit} (+ uncommitted changes)\n"
            f"- command: `python -m benchmarks.soak {argv}`\n"
            f"- mix (weights): {', '.join(f'{k} {w}' for k, w in KINDS.items())}"
            f"{f', hostile {HOSTILE_WEIGHT} (benchmarks.hostile)' if args.hostile else ''}; max_tokens 4..{args.max_tokens}, "
            "ignore_eos; baseline for memory and throughput: the same run's warm-up and first third\n"
            f"- verdict: {'PASS' if not failed else 'FAIL: ' + '; '.join(failed)}\n\n"
            f"| measure | value |\n|---|---|\n{table}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of load, warm-up included")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds before the memory baseline is taken")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32, help="largest max_tokens of a completed request")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hostile", action="store_true",
                        help="mix in benchmarks.hostile's requests (huge, malformed, adversarial); any 5xx fails")
    parser.add_argument("--server-arg", action="append", default=[], help="extra `serve` argument (repeatable)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument("--append-results", action="store_true", help="append a section to benchmarks/RESULTS.md")
    args = parser.parse_args(argv)
    result = run(args)
    failed = verdict(result)
    print(json.dumps(result, indent=2))
    print("PASS" if not failed else "FAIL: " + "; ".join(failed))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if args.append_results:
        with (REPO_ROOT / "benchmarks" / "RESULTS.md").open("a") as f:
            f.write(results_section(result, args, failed))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
