"""One stream decoding for a while, to see where a batch-1 step's host time goes:

    python -m benchmarks.decode_b1 --seconds 10                   # through the engine core (Llama-3.2-1B shape, CUDA)
    py-spy record --subprocesses -o b1.txt -f raw -- python -m benchmarks.decode_b1 --seconds 10
    python -m benchmarks.decode_b1 --timers --seconds 5           # in-process, with host timers around the step's parts
    python -m benchmarks.decode_b1 --smoke [--timers]             # a tiny model on the CPU, for the test suite
    python -m benchmarks.decode_b1 --timers --streams 256 --tokens 128   # the host's share of a 256-row step

Requests of `--tokens` tokens (128-token prompts) run one after another (`--streams` of them at once) until
`--seconds` have passed; prints the median inter-token gap as the caller sees it, as JSON. `--timers` runs the
engine in this process and wraps the step's parts (scheduling, launch, graph replay, sampler, the wait for the
device, output handling) in perf_counter timers: each part's mean host microseconds per step, without a profiler's
distortion (a timer costs well under a microsecond). On CUDA it then times `CUDAGraph.replay()` on the host, back
to back on a busy device: the same batch-1 graph each time, two graphs in turn, and one at a time on an idle device.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch

from benchmarks import gpu_models as gm
from benchmarks.gpu_bench import _request, _stream
from runtime.config import EngineConfig
from runtime.native.llm_engine import NativeEngine
from runtime.native.model_runner import PendingStep
from runtime.process.client import EngineClient
from runtime.native.sampler import Sampler

# the step's parts, patched on the instances (the loop calls them through self): the driver's step, the core's
CORE_PARTS = ("step", "_run", "_step_inputs", "_collect_inflight", "_update", "publish_stats")
# library calls inside them, patched on their classes
CLASS_PARTS: tuple[tuple[Any, str], ...] = (
    (torch.cuda.CUDAGraph, "replay"), (torch.cuda.Event, "synchronize"), (torch.cuda.Event, "record"),
    (PendingStep, "collect"), (Sampler, "__call__"))


class HostTimers:
    """Summed perf_counter seconds and calls per wrapped function."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        seconds, calls, clock = self.seconds, self.calls, time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[name] += clock() - t
                calls[name] += 1

        return timed

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()

    def per_step_us(self, steps: int) -> dict[str, dict[str, float]]:
        return {name: {"us_per_step": round(s / steps * 1e6, 1), "calls_per_step": round(self.calls[name] / steps, 2)}
                for name, s in sorted(self.seconds.items(), key=lambda kv: -kv[1])}


@contextmanager
def timed_engine(engine: NativeEngine, timers: HostTimers) -> Iterator[None]:
    """Wrap the engine's step parts (instance attributes) and CLASS_PARTS (class attributes) in `timers`."""
    engine.step = timers.wrap("NativeEngine.step", engine.step)
    for name in CORE_PARTS:
        setattr(engine.core, name, timers.wrap(f"EngineCore.{name}", getattr(engine.core, name)))
    for obj, name in ((engine.scheduler, "schedule"), (engine.scheduler, "update_from_output"),
                      (engine.scheduler, "hold_places"), (engine.runner, "launch"), (engine.outbox, "put")):
        setattr(obj, name, timers.wrap(f"{type(obj).__name__}.{name}", getattr(obj, name)))
    if engine.runner.graphs is not None:
        graphs = engine.runner.graphs
        graphs.run = timers.wrap(f"{type(graphs).__name__}.run", graphs.run)
    originals = [(cls, name, getattr(cls, name)) for cls, name in CLASS_PARTS]
    for cls, name, fn in originals:
        setattr(cls, name, timers.wrap(f"{cls.__name__}.{name}", fn))
    try:
        yield
    finally:
        for cls, name, fn in originals:
            setattr(cls, name, fn)


def replay_host_us(engine: NativeEngine, replays: int = 60) -> dict[str, float]:
    """Host microseconds per CUDAGraph.replay() of the batch-1 decode graph (median after 5), on a device kept
    busy by the replays before it: the same graph each time, the two graph sets' in turn, and on an idle device
    (synchronized before each). Nothing is stored (KV slot -1)."""
    from runtime.native.decode_rows import IDS, LENGTHS, PREV, SLOTS

    graphs = engine.runner.graphs
    for turn in (0, 1):  # what each graph set copies in
        packed, _ = graphs.host_views(turn)
        packed[IDS, :1], packed[SLOTS, :1], packed[LENGTHS, :1], packed[PREV, :1] = 0, -1, 128, -1
    one, two = graphs.base[0][1], graphs.base[1][1]

    def timed(order: list[Any], idle: bool) -> float:
        torch.cuda.synchronize()
        times = []
        for g in order:
            if idle:
                torch.cuda.synchronize()
            t = time.perf_counter()
            g.replay()
            times.append(time.perf_counter() - t)
        torch.cuda.synchronize()
        return round(statistics.median(times[5:]) * 1e6, 1)

    return {"same_graph": timed([one] * replays, False), "two_graphs_in_turn": timed([one, two] * (replays // 2), False),
            "idle_device": timed([one] * replays, True)}


async def run(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    streams = args.streams
    config = EngineConfig(model=str(folder), device=device, dtype="bfloat16", max_batch_size=max(8, streams),
                          max_kv_tokens=max(8 * 4096, streams * (128 + args.tokens + 16)), max_model_len=4096,
                          enable_prefix_caching=False)
    engine: NativeEngine | EngineClient = NativeEngine(config) if args.timers else EngineClient(config)
    await engine.start()
    await engine.warmed_up()  # the CPU's compiled steps, built while eager ones serve
    timers = HostTimers()
    gaps: list[float] = []
    result: dict[str, Any] = {}
    try:
        with timed_engine(engine, timers) if isinstance(engine, NativeEngine) else nullcontext():
            await _stream(engine, _request("b1-warm", gm.random_prompts(1, 128, vocab, seed=-1)[0], 8))
            timers.reset()
            steps0 = engine.stats().iterations if isinstance(engine, NativeEngine) else 0
            stop_at = time.perf_counter() + args.seconds
            i = 0
            while time.perf_counter() < stop_at or i < 2 * streams:  # two rounds at least, whatever the machine's speed
                prompts = gm.random_prompts(streams, 128, vocab, seed=i)
                done = await asyncio.gather(*(_stream(engine, _request(f"b1-{i + k}", prompt, args.tokens))
                                              for k, prompt in enumerate(prompts)))
                for _, arrivals, _ in done:
                    gaps.extend(b - a for a, b in zip(arrivals[1:], arrivals[2:]))
                i += streams
            result.update(itl_ms_p50=statistics.median(gaps) * 1e3, tokens=len(gaps) + i, streams=streams)
        if isinstance(engine, NativeEngine) and engine.runner.graphs is not None and device == "cuda":
            result["replay_host_us"] = replay_host_us(engine)
    finally:
        await engine.shutdown()
    if isinstance(engine, NativeEngine):
        # read once the step thread has stopped: the last step hands its token over before its own timers (and
        # Outbox.put's) close, so a read as the last stream ends misses that step's calls
        steps = engine.stats().iterations - steps0
        result["steps"] = steps
        result["host_us_per_step"] = timers.per_step_us(steps)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--tokens", type=int, default=1024, help="tokens per request")
    parser.add_argument("--timers", action="store_true", help="in-process engine, host timers around its parts")
    parser.add_argument("--streams", type=int, default=1, help="requests decoding at once (a step's rows)")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.streams < 1:
        parser.error(f"--streams must be at least 1, got {args.streams}")
    shape = gm.TINY if args.smoke else gm.LLAMA_1B
    if args.smoke:
        args.seconds, args.tokens = min(args.seconds, 0.1), min(args.tokens, 16)
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work) / "model"
        gm.make_checkpoint(folder, shape, torch.bfloat16)
        print(json.dumps(asyncio.run(run(args, folder))), flush=True)


if __name__ == "__main__":
    main()
