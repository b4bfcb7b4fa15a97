"""Small-request latency while large or hostile requests are processed, against the same server idle.

    python -m benchmarks.hostile --duration 20 [--append-results]

One gateway on the demo model, with its engine core in its own process and gRPC on. Phase "idle": a prober
sends GET /health, a 1-token completion and a 1-token gRPC ModelInfer in turn for `--duration` seconds. Phase
"hostile": the same prober while `--senders` clients send the requests of `HOSTILE` over HTTP (huge prompts,
long chats, thousands of words, lone surrogates, giant integers, enums of 100k values, and the 2026-11-28
probe's cases: schemas that are no schema, empty batches, 5 MB of metadata, ...) and of
benchmarks.hostile_grpc's `GRPC_HOSTILE` over gRPC, one after another. Reported: the prober's p50/p99/max per
phase and kind and their ratio, the statuses the hostile requests got, and whether the server process was
still there at the end (any 5xx, gRPC server error or exit fails the run). Before the hostile-input work an 8 MB
prompt held the event loop for 5.6 s, so /health's p99 was seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np

from benchmarks.hostile_grpc import GRPC_HOSTILE, SERVER_ERRORS, small_infer
from benchmarks.overhead import _commit, _machine
from benchmarks.procs import REPO_ROOT, Server, free_port

_NESTED_TOOL = {"type": "function", "function": {"name": "trip", "parameters": {  # pydantic's shape: $defs, $ref
    "type": "object", "properties": {"start": {"$ref": "#/$defs/Place"}}, "required": ["start"],
    "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 4}},
                        "required": ["city"]}}}}}
_INFER = {"text_input": ("BYTES", ["x"]), "max_tokens": ("INT32", [2])}


def _infer_body(**inputs: tuple[str, list[Any]]) -> bytes:
    """A KServe /infer body of [1, 1] JSON tensors: a small ensemble request with `inputs` added."""
    return json.dumps({"inputs": [{"name": name, "datatype": datatype, "shape": [1, 1], "data": data}
                                  for name, (datatype, data) in {**_INFER, **inputs}.items()]}).encode()

# name -> (path, raw JSON body). Built lazily: some are megabytes.
HOSTILE: dict[str, Callable[[str], tuple[str, bytes]]] = {
    "prompt_7mb": lambda m: ("/v1/completions", json.dumps({"model": m, "prompt": "word " * 1_400_000,
                                                             "max_tokens": 1}).encode()),
    "prompts_256x30kb": lambda m: ("/v1/completions", json.dumps({"model": m, "prompt": ["def f(x): " * 3000] * 256,
                                                                   "max_tokens": 1}).encode()),
    "chat_1000_messages": lambda m: ("/v1/chat/completions", json.dumps({"model": m, "max_tokens": 1, "messages": [
        {"role": "user" if i % 2 == 0 else "assistant", "content": "import os " * 20} for i in range(1001)]}).encode()),
    "triton_256_bad_words": lambda m: ("/v2/models/ensemble/generate", json.dumps({
        "text_input": "def", "max_tokens": 1, "bad_words": [f"word{i}" for i in range(256)]}).encode()),
    "triton_25000_bad_words": lambda m: ("/v2/models/ensemble/generate", json.dumps({
        "text_input": "def", "max_tokens": 1, "bad_words": [f"word{i}" for i in range(25_000)]}).encode()),
    "lone_surrogate": lambda m: ("/v1/completions", b'{"model": "%s", "prompt": "\\ud800", "max_tokens": 1}'
                                 % m.encode()),
    "integer_5000_digits": lambda m: ("/v1/completions", b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}"),
    "enum_100k_schema": lambda m: ("/v1/chat/completions", json.dumps({
        "model": m, "max_tokens": 4, "messages": [{"role": "user", "content": "pick"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "pick", "schema": {
            "type": "string", "enum": [f"value{i}" for i in range(100_000)]}}}}).encode()),
    "bad_tool_calls": lambda m: ("/v1/chat/completions", json.dumps({"model": m, "max_tokens": 1, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [{"foo": 1}]},
        {"role": "user", "content": "again"}]}).encode()),
    # the 2026-11-28 probe's cases (issue 40)
    "guided_not_a_schema": lambda m: ("/v2/models/ensemble/generate", json.dumps({  # ended the engine core
        "text_input": "x", "max_tokens": 2, "guided_decoding": "1"}).encode()),
    "guided_100k_brackets": lambda m: ("/v2/models/ensemble/generate", json.dumps({
        "text_input": "x", "max_tokens": 2, "guided_decoding": "[" * 100_000}).encode()),
    "infer_not_a_schema": lambda m: ("/v2/models/ensemble/infer", _infer_body(guided_decoding=("BYTES", ["[]"]))),
    "infer_empty_batch": lambda m: ("/v2/models/ensemble/infer", json.dumps({"inputs": [
        {"name": "text_input", "datatype": "BYTES", "shape": [0, 1], "data": []},
        {"name": "max_tokens", "datatype": "INT32", "shape": [0, 1], "data": []}]}).encode()),
    "infer_datatype_a_list": lambda m: ("/v2/models/ensemble/infer", json.dumps({"inputs": [
        {"name": "text_input", "datatype": ["BYTES"], "shape": [1, 1], "data": ["x"]}]}).encode()),
    "infer_stop_of_nobody": lambda m: ("/v2/models/ensemble/infer", _infer_body(stop=("BOOL", [True]))),
    "responses_5mb_metadata": lambda m: ("/v1/responses", json.dumps({
        "model": m, "input": "hi", "max_output_tokens": 1, "metadata": {"k": "v" * 5_000_000}}).encode()),
    "tool_with_defs_required": lambda m: ("/v1/chat/completions", json.dumps({
        "model": m, "max_tokens": 24, "messages": [{"role": "user", "content": "go"}], "tools": [_NESTED_TOOL],
        "tool_choice": "required"}).encode()),
}


async def probe(client: httpx.AsyncClient, channel: grpc.aio.Channel, model: str, until: float
                ) -> dict[str, list[float]]:
    """Latencies (ms) of small requests sent one at a time until `until`, by kind."""
    out: dict[str, list[float]] = {"health": [], "completion": [], "grpc_infer": []}
    small = {"model": model, "prompt": "import", "max_tokens": 1}

    async def http(send: Any) -> None:
        r = await send
        if r.status_code != 200:
            raise RuntimeError(f"a small request failed with {r.status_code}: {r.text[:200]}")

    while time.monotonic() < until:
        for kind, send in (("health", lambda: http(client.get("/health"))),
                           ("completion", lambda: http(client.post("/v1/completions", json=small))),
                           ("grpc_infer", lambda: small_infer(channel))):
            start = time.perf_counter()
            await send()
            out[kind].append((time.perf_counter() - start) * 1e3)
    return out


async def hostile_sender(client: httpx.AsyncClient, channel: grpc.aio.Channel, model: str, until: float,
                         statuses: Counter, offset: int, only: list[str]) -> None:
    """Sends HOSTILE (HTTP) and GRPC_HOSTILE in turn until `until`, counting "name status"."""
    bodies = {name: make(model) for name, make in HOSTILE.items() if not only or name in only}
    calls = {name: call for name, call in GRPC_HOSTILE.items() if not only or name in only}
    names = [*bodies, *calls]
    i = offset
    while time.monotonic() < until:
        name = names[i % len(names)]
        if name in calls:
            statuses[f"{name} {await calls[name](channel)}"] += 1
        else:
            path, body = bodies[name]
            r = await client.post(path, content=body, headers={"content-type": "application/json"})
            statuses[f"{name} {r.status_code}"] += 1
        i += 1


def is_server_error(status: str) -> bool:
    """A "name status" key of a 5xx or a gRPC server error."""
    code = status.rsplit(" ", 1)[-1].removesuffix(")")
    return code.startswith("5") or status.split(" ", 1)[1] in SERVER_ERRORS


def summary(latencies: list[float]) -> dict[str, float]:
    p50, p99 = np.percentile(latencies, [50, 99])
    return {"count": len(latencies), "p50_ms": round(float(p50), 2), "p99_ms": round(float(p99), 2),
            "max_ms": round(max(latencies), 2)}


def send_hostile(url: str, grpc_address: str, model: str, duration: float, senders: int, only: list[str],
                 out: Any) -> None:
    """In a child process, so that building and sending megabyte bodies never delays the prober's clock."""
    async def main() -> Counter:
        statuses: Counter = Counter()
        until = time.monotonic() + duration
        async with httpx.AsyncClient(base_url=url, timeout=300) as client, \
                grpc.aio.insecure_channel(grpc_address) as channel:
            await asyncio.gather(*(hostile_sender(client, channel, model, until, statuses, k, only)
                                   for k in range(senders)))
        return statuses

    out.put(dict(asyncio.run(main())))


async def measure(url: str, grpc_address: str, duration: float, senders: int, only: list[str]) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client, \
            grpc.aio.insecure_channel(grpc_address) as channel:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        idle = await probe(client, channel, model, time.monotonic() + duration)
        context = multiprocessing.get_context("spawn")
        out = context.Queue()
        sender = context.Process(target=send_hostile, args=(url, grpc_address, model, duration, senders, only, out))
        sender.start()
        busy = await probe(client, channel, model, time.monotonic() + duration)
        statuses: dict[str, int] = await asyncio.to_thread(out.get)
        sender.join()
    idle_s, busy_s = summary(sum(idle.values(), [])), summary(sum(busy.values(), []))
    return {"idle": idle_s, "hostile": busy_s, "p99_ratio": round(busy_s["p99_ms"] / idle_s["p99_ms"], 2),
            "by_kind": {kind: {"idle": summary(idle[kind]), "hostile": summary(busy[kind])} for kind in idle},
            "hostile_statuses": dict(sorted(statuses.items())),
            "server_5xx": sum(n for k, n in statuses.items() if is_server_error(k))}


def run(args: argparse.Namespace) -> dict[str, Any]:
    # the demo model unless --server-arg names another (a later --model wins)
    grpc_port = free_port()
    command = [sys.executable, "-m", "gateway", "serve", "--port", "{port}", "--grpc-port", str(grpc_port),
               "--log-level", "warning", "--model", "demo", *args.server_arg]
    server = Server("", command=command, ready_path="/health")
    try:
        server.wait_ready()
        result = asyncio.run(measure(server.base_url, f"127.0.0.1:{grpc_port}", args.duration, args.senders,
                                     args.only))
        result["server_exited"] = server.proc.poll() is not None  # nothing a request sends may end it
        return result
    finally:
        server.stop()


def results_section(result: dict[str, Any], args: argparse.Namespace) -> str:
    phases = [("idle (baseline)", "all", result["idle"]), ("hostile", "all", result["hostile"])]
    phases += [(phase, kind, by[key]) for kind, by in result["by_kind"].items()
               for phase, key in (("idle (baseline)", "idle"), ("hostile", "hostile"))]
    rows = "\n".join(f"| {phase} | {kind} | {r['count']} | {r['p50_ms']} | {r['p99_ms']} | {r['max_ms']} |"
                     for phase, kind, r in phases)
    statuses = ", ".join(f"{k}: {v}" for k, v in result["hostile_statuses"].items())
    return (f"\n## {datetime.now(timezone.utc):%Y-%m-%d %H:%M} small-request latency beside hostile requests "
            "(demo model, CPU)\n\n"
            f"- machine: {_machine()}; commit: {_commit()}\n"
            f"- command: `python -m benchmarks.hostile {' '.join(sys.argv[1:])}`\n"
            f"- prober: GET /health, a 1-token completion and a 1-token gRPC ModelInfer in turn, one at a time; "
            f"{args.senders} senders of the hostile mix (HTTP and gRPC) beside it in the second phase\n"
            f"- p99 ratio hostile / idle: **{result['p99_ratio']}x**; hostile 5xx and gRPC server errors: "
            f"{result['server_5xx']}; server process exited: {result['server_exited']}\n"
            f"- hostile statuses: {statuses}\n\n"
            "| phase | kind | small requests | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|---|\n" + rows + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of each phase")
    parser.add_argument("--senders", type=int, default=2, help="concurrent senders of hostile requests")
    parser.add_argument("--only", action="append", default=[], choices=[*HOSTILE, *GRPC_HOSTILE],
                        help="send only this kind of hostile request (repeatable; default: all)")
    parser.add_argument("--server-arg", action="append", default=[], help="extra `serve` argument (repeatable)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument("--append-results", action="store_true", help="append a section to benchmarks/RESULTS.md")
    args = parser.parse_args(argv)
    print(f"hostile: two phases of {args.duration:g} s each (idle, then beside hostile requests)", flush=True)
    result = run(args)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if args.append_results:
        with (REPO_ROOT / "benchmarks" / "RESULTS.md").open("a") as f:
            f.write(results_section(result, args))
    return 1 if result["server_5xx"] or result["server_exited"] else 0


if __name__ == "__main__":
    sys.exit(main())
