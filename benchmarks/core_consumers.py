"""The engine core under closed-loop streams from several consumer processes (gpu_bench's engine phase).

    python -m benchmarks.core_consumers < ConsumerArgs as JSON    # started by `closed_loop_processes`

One Python process consuming 256 streams is itself a limit (its event loop handles every delta), so the
engine-core figure that HTTP at 256 streams is compared with comes from the same shape as the HTTP load:
several processes (front ends of one core, as --api-servers runs them; runtime/process/client.py), each
running its share of the streams for the same time. This process is front end 0 and starts the core; the
others attach, say "ready" on stdout, start on "go" from stdin, and print their result as JSON.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import tempfile
from typing import Any

import msgspec

from benchmarks import gpu_models as gm
from benchmarks.gpu_bench import Sizes, _closed_loop, _request, _stream
from runtime.config import EngineConfig
from runtime.process.client import EngineClient, FrontEnd


class ConsumerArgs(msgspec.Struct):
    config: EngineConfig
    folder: str
    index: int
    count: int
    sizes: dict[str, Any]
    vocab: int
    seed: int


async def closed_loop_processes(config: EngineConfig, sizes: Sizes, vocab: int, seed: int,
                                processes: int) -> dict[str, Any]:
    """`sizes.batch` closed-loop streams split over `processes` front ends of one new engine core, for
    `sizes.closed_loop_s`: the summed tok/s, and each process's own figure and event-loop lag p99."""
    folder = tempfile.mkdtemp(prefix="core-consumers-")
    share = dataclasses.replace(sizes, streams=sizes.batch // processes)
    others = [subprocess.Popen([sys.executable, "-m", "benchmarks.core_consumers"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True) for _ in range(processes - 1)]
    for i, proc in enumerate(others, start=1):
        assert proc.stdin is not None
        proc.stdin.write(msgspec.json.encode(ConsumerArgs(config, folder, i, processes, msgspec.to_builtins(
            share), vocab, seed + i)).decode() + "\n")
        proc.stdin.flush()
    engine = EngineClient(config, FrontEnd(0, processes, folder))
    try:
        await engine.start()
        for proc in others:  # each has its Ready: the core is up for all
            assert proc.stdout is not None
            line = await asyncio.to_thread(proc.stdout.readline)
            if line.strip() != "ready":
                raise RuntimeError(f"a consumer process failed to attach: {line!r}")
        await asyncio.gather(*(_stream(engine, _request(f"p0-w{i}", p, 8))  # warm-up: every prefill shape
                               for i, p in enumerate(gm.random_prompts(sizes.batch, sizes.prompt, vocab, seed))))
        for proc in others:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = [await _closed_loop(engine, share, vocab, seed, label="p0-")]
        for proc in others:
            out, _ = await asyncio.to_thread(proc.communicate, timeout=share.closed_loop_s + 60)
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in others:
            if proc.poll() is None:
                proc.kill()
        await engine.shutdown()
    key = f"closed_loop_{share.streams}_tok_s"
    return {f"closed_loop_{sizes.batch}_tok_s_client_procs": sum(r[key] for r in results),
            "client_procs": processes, "client_procs_tok_s": [r[key] for r in results],
            "client_procs_lag_ms_p99": [r["event_loop_lag_ms_p99"] for r in results],
            "client_procs_delay_ms_p99": [r["event_loop_delay_ms_p99"] for r in results]}


async def _consume(args: ConsumerArgs) -> dict[str, Any]:
    engine = EngineClient(args.config, FrontEnd(args.index, args.count, args.folder))
    await engine.start()
    try:
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # "go"
        return await _closed_loop(engine, Sizes(**args.sizes), args.vocab, args.seed, label=f"p{args.index}-")
    finally:
        await engine.shutdown()


def main() -> int:
    args = msgspec.json.decode(sys.stdin.readline(), type=ConsumerArgs)
    print(json.dumps(asyncio.run(_consume(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
