"""The engine core under closed-loop streams from several consumer processes (gpu_bench's engine phase).

    python -m benchmarks.core_consumers < ConsumerArgs as JSON    # started by `CoreConsumers`

One Python process consuming 256 streams is itself a limit (its event loop handles every delta), so the
engine-core figure that HTTP at 256 streams is compared with comes from the same shape as the HTTP load:
several processes (front ends of one core, as --api-servers runs them; runtime/process/client.py), each
running its share of the streams for the same time. This process is front end 0 and starts the core; the
others attach and say "ready" on stdout, then run one round per "go" from stdin, printing its result as JSON,
until stdin closes. Rounds let a benchmark interleave this baseline with the load it is compared with
(benchmarks/http_vs_core.py).
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


class CoreConsumers:
    """`sizes.batch` closed-loop streams split over `processes` front ends of one new engine core, run in rounds
    of `sizes.closed_loop_s` (async context manager: starts the core and the other processes, and warms up).
    `engine`: for one process, a started client of a core of `config` to use (and leave running) instead of a new
    core (gpu_bench's smoke run: a core start is 3 s of CPU)."""

    def __init__(self, config: EngineConfig, sizes: Sizes, vocab: int, seed: int, processes: int,
                 engine: EngineClient | None = None) -> None:
        assert engine is None or processes == 1, "the other processes attach to a core started with room for them"
        self.config, self.sizes, self.vocab, self.seed, self.processes = config, sizes, vocab, seed, processes
        self.share = dataclasses.replace(sizes, streams=sizes.batch // processes)
        self.folder = tempfile.mkdtemp(prefix="core-consumers-")
        self.others: list[subprocess.Popen[str]] = []
        self.owned = engine is None
        self.engine = engine or EngineClient(config, FrontEnd(0, processes, self.folder))
        self.rounds = 0

    async def __aenter__(self) -> CoreConsumers:
        self.others = [subprocess.Popen([sys.executable, "-m", "benchmarks.core_consumers"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True) for _ in range(self.processes - 1)]
        try:
            for i, proc in enumerate(self.others, start=1):
                self._tell(proc, msgspec.json.encode(ConsumerArgs(
                    self.config, self.folder, i, self.processes, msgspec.to_builtins(self.share), self.vocab,
                    self.seed + i)).decode())
            await self.engine.start()
            for proc in self.others:  # each has its Ready: the core is up for all
                assert proc.stdout is not None
                line = await asyncio.to_thread(proc.stdout.readline)
                if line.strip() != "ready":
                    raise RuntimeError(f"a consumer process failed to attach: {line!r}")
            prompts = gm.random_prompts(self.sizes.batch, self.sizes.prompt, self.vocab, self.seed)
            await asyncio.gather(*(_stream(self.engine, _request(f"p0-w{i}", p, 8))  # warm-up: every prefill shape
                                   for i, p in enumerate(prompts)))
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        for proc in self.others:
            if proc.poll() is None and proc.stdin is not None:
                proc.stdin.close()  # their loop ends
        for proc in self.others:
            try:
                await asyncio.to_thread(proc.wait, timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.owned:
            await self.engine.shutdown()

    async def round(self) -> dict[str, Any]:
        """One round: every process runs its streams for `closed_loop_s`; the summed tok/s, and each process's
        own figure and event-loop figures."""
        for proc in self.others:
            self._tell(proc, "go")
        label = f"p0r{self.rounds}-"
        self.rounds += 1
        before = self.engine.stats()
        results = [await _closed_loop(self.engine, self.share, self.vocab, self.seed, label=label)]
        for proc in self.others:
            assert proc.stdout is not None
            line = await asyncio.to_thread(proc.stdout.readline)
            if not line:
                raise RuntimeError(f"a consumer process ended mid-round (exit code {proc.poll()})")
            results.append(json.loads(line))
        after = self.engine.stats()  # at most STATS_PERIOD old: a few steps of a round's thousands
        key = f"closed_loop_{self.share.streams}_tok_s"
        return {f"closed_loop_{self.sizes.batch}_tok_s_client_procs": sum(r[key] for r in results),
                "client_procs": self.processes, "client_procs_tok_s": [r[key] for r in results],
                "client_procs_lag_ms_p99": [r["event_loop_lag_ms_p99"] for r in results],
                "client_procs_ttft_ms_p50": [r["ttft_ms_p50"] for r in results],
                "client_procs_tpot_ms_p50": [r["tpot_ms_p50"] for r in results],
                "client_procs_e2e_ms_p50": [r["e2e_ms_p50"] for r in results],
                "client_procs_gap_ms_p50": [r["gap_ms_p50"] for r in results],
                "client_procs_delay_ms_p99": [r["event_loop_delay_ms_p99"] for r in results],
                "steps": after.iterations - before.iterations,
                "eager_steps": after.eager_iterations - before.eager_iterations}

    @staticmethod
    def _tell(proc: subprocess.Popen[str], line: str) -> None:
        assert proc.stdin is not None
        proc.stdin.write(line + "\n")
        proc.stdin.flush()


async def closed_loop_processes(config: EngineConfig, sizes: Sizes, vocab: int, seed: int,
                                processes: int, engine: EngineClient | None = None) -> dict[str, Any]:
    """One round of `CoreConsumers` on a new core (or on `engine`'s: see there)."""
    async with CoreConsumers(config, sizes, vocab, seed, processes, engine) as consumers:
        return await consumers.round()


async def _consume(args: ConsumerArgs) -> None:
    engine = EngineClient(args.config, FrontEnd(args.index, args.count, args.folder))
    await engine.start()
    try:
        print("ready", flush=True)
        rounds = 0
        while (await asyncio.to_thread(sys.stdin.readline)).strip() == "go":
            result = await _closed_loop(engine, Sizes(**args.sizes), args.vocab, args.seed,
                                        label=f"p{args.index}r{rounds}-")
            rounds += 1
            print(json.dumps(result), flush=True)
    finally:
        await engine.shutdown()


def main() -> int:
    args = msgspec.json.decode(sys.stdin.readline(), type=ConsumerArgs)
    asyncio.run(_consume(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
