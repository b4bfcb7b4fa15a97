"""How long a new request waits for the engine's step thread: from submission to the start of the first step that
can take it, in the in-process engine (runtime/native/llm_engine.py) over the demo model on CPU, one client sending
one-token requests back to back (the next one as soon as the last token arrives) and with a pause between them.

    python -m benchmarks.request_pickup                      # 40 requests a round, 2 rounds each way
    python -m benchmarks.request_pickup --requests 4 --rounds 1   # the test suite's smoke run

Async scheduling (on by default with a GPU) is on: the step after a request's last launch only collects its token, runs
nothing new, and the step thread then waits a moment before it looks again; a request sent back to back arrives in
that wait (benchmarks/RESULTS.md, 2026-11-30). Prints one JSON line: median milliseconds a round, for each way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from benchmarks import gpu_models as gm
from benchmarks.gpu_bench import _request, _stream


async def pickup_ms(requests: int, rounds: int, pause_s: float) -> dict[str, list[float]]:
    from runtime.config import EngineConfig
    from runtime.native.llm_engine import NativeEngine

    engine = NativeEngine(EngineConfig(model="demo", device="cpu", async_scheduling=True))
    await engine.start()
    starts: list[float] = []
    step = engine.step

    def timed_step() -> int:
        starts.append(time.perf_counter())
        return step()

    engine.step = timed_step  # type: ignore[method-assign]
    figures: dict[str, list[float]] = {"back_to_back": [], f"after_{pause_s * 1e3:g}_ms": []}
    try:
        for r in range(rounds):
            for way, pause in zip(figures, (0.0, pause_s)):
                waits = []
                for i, prompt in enumerate(gm.random_prompts(requests, 8, 400, r)):
                    starts.clear()
                    t, _, _ = await _stream(engine, _request(f"{way}-{r}-{i}", prompt, 1))
                    waits.append((starts[0] - t) * 1e3)
                    await asyncio.sleep(pause)
                figures[way].append(round(statistics.median(waits), 3))
    finally:
        await engine.shutdown()
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pause-ms", type=float, default=20.0)
    args = parser.parse_args(argv)
    figures = asyncio.run(pickup_ms(args.requests, args.rounds, args.pause_ms / 1e3))
    print(json.dumps({f"{way}_pickup_ms": values for way, values in figures.items()}))


if __name__ == "__main__":
    main()
