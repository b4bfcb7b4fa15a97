"""GPU benchmark of the native runtime (issue 8), every baseline measured in the same run.

    python -m benchmarks.gpu_bench --out /tmp/gpu_bench            # on a CUDA machine
    python -m benchmarks.gpu_bench --out DIR --skip http,tserve     # engine-only parts
    python -m benchmarks.gpu_bench --device cpu --smoke --skip tserve  # every phase's code, tiny, in seconds

Model: Llama-3.2-1B-shaped, random bf16 weights (benchmarks/gpu_models.py). Phases, each recorded
in DIR/gpu_bench.json even when a later one fails:
  bandwidth   device-to-device copy (bytes read + written): the floor of a decode step is weights / this
  correctness logits vs transformers (bf16), greedy ids vs transformers for 32 steps (fp32, small model)
  hf          transformers generate: ms per step at batch 1, output tok/s at batch 64
  engine      our NativeEngine in-process: decode ITL at batch 1 (128-token context), GPU time of one
              graphed decode step, TTFT of a 1024-token prompt (and of one more under torch.profiler: its
              steps' wall time vs their kernel time, profile_ttft.txt), 256 x 128/128 throughput, 64 closed-loop
              streams (with event-loop lag), and a torch.profiler summary of a batch-256 window; then
              the same engine core in its own process behind EngineClient (the server's default: batch-1
              ITL, 256-request throughput, 64 closed-loop streams with this process's event-loop lag, and
              256 closed-loop streams from 4 processes, the HTTP load's shape: benchmarks/core_consumers.py),
              batch-1 ITL and 256-request throughput with async scheduling off, and batch-1 without graphs
  http        our gateway over HTTP, 64 concurrent streams (benchmarks/serve.py), vs the engine at 64
  http_batch  our gateway over HTTP, 256 concurrent streams, vs the engine core's 256 closed-loop streams
  http_api2, http_api4, http_batch_api2, http_batch_api4   the same with --api-servers 2 / 4 (front ends over one core)
  http_batch_dp2   `http_batch` with --data-parallel-size 2 (two engine cores, a GPU each: needs two GPUs)
  http_in_process  `http` with --no-engine-process (the engine in the HTTP server's process)
  tserve      `transformers serve --continuous-batching` over HTTP, same load
`--skip profile` leaves out the engine phase's torch.profiler window; `--skip engine_load` ends the engine phase
after its latency figures (in-process batch-1 ITL and TTFT), for quick per-process comparisons.
A phase that raises is recorded (its traceback in the JSON and on stderr), the later phases still run,
and the run exits 1 at the end. --smoke runs every phase on a tiny model with tiny loads (SMOKE below);
its figures mean nothing, it only proves the code runs (tests/benchmarks runs it on the CPU, where the
CUDA-only parts, CUDA graphs and the no-graphs rerun, are skipped).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import gc
import io
import json
import pstats
import random
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks import gpu_models as gm
from benchmarks.cuda_timing import HostEvent, cuda_event, ms_per_call
from benchmarks.dataset import normal_length


@dataclass(frozen=True)
class Sizes:
    """Model shapes, loads and durations of a run."""

    big: dict[str, Any] = field(default_factory=lambda: gm.LLAMA_1B)  # the timed model
    small: dict[str, Any] = field(default_factory=lambda: gm.SMALL)  # the fp32 greedy check's model
    prompt: int = 128  # tokens in, per request
    output: int = 128  # tokens out, per request
    # spread of the closed loops' tokens out (Normal, at least 1): 0 keeps equal streams in step, so they end in
    # the same step and the next requests arrive in one burst; a spread lets them drift apart, as a real mix does
    output_std: float = 0.0
    batch: int = 256  # throughput and profile requests, all at once (the engine's max batch)
    streams: int = 64  # closed-loop and HTTP concurrency
    closed_loop_s: float = 15.0
    http_s: float = 20.0
    ttft_prompt: int = 1024
    logits_prompt: int = 200
    greedy_steps: int = 32
    hf_batch1_tokens: int = 32
    copy_gib: float = 1.0
    max_model_len: int = 4096
    consumer_processes: int = 4  # processes consuming the engine core's closed loop of `batch` streams


FULL = Sizes()
# Smoke loads: 0.1 s of a tiny model's closed loop is tens of requests (0.3 s over HTTP, where the load generator
# starts and warms up), enough to run every figure's code. One consumer process, whose round runs on the `client`
# variant's core (no core started for it): the engine core's several-process rounds are http_vs_core's smoke's
# (--consumers 2).
SMOKE = Sizes(big=gm.TINY, small=gm.TINY, prompt=16, output=8, batch=8, streams=4, closed_loop_s=0.1, http_s=0.3,
              ttft_prompt=64, logits_prompt=40, greedy_steps=8, hf_batch1_tokens=4, copy_gib=1 / 64,
              max_model_len=256, consumer_processes=1)


def bandwidth_tb_s(gib: float = 1.0, device: str = "cuda") -> float:
    """Device-to-device copy rate, bytes read + written, median of 20 copies."""
    n = int(gib * 2**30) // 2
    src = torch.randn(n, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    event = cuda_event if torch.device(device).type == "cuda" else HostEvent  # host memory: --smoke on the CPU
    seconds = ms_per_call(lambda: dst.copy_(src), rounds=20, warmup=5, event=event) / 1e3
    return 2 * n * 2 / seconds / 1e12


def _request(rid: str, prompt: list[int], max_tokens: int) -> Any:
    from runtime.request import GenerationRequest, SamplingOptions

    return GenerationRequest(rid, prompt_token_ids=prompt,
                             sampling=SamplingOptions(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))


async def _stream(engine: Any, req: Any) -> tuple[float, list[float], int]:
    """(submit time, arrival time of each delta, tokens) of one request."""
    t0 = time.perf_counter()
    arrivals, tokens = [], 0
    async for delta in engine.generate(req):
        arrivals.append(time.perf_counter())
        tokens += len(delta.token_ids)
    return t0, arrivals, tokens


async def _loop_lag(stop: asyncio.Event, lags: list[float], delays: list[float]) -> None:
    """The event loop's responsiveness while the engine runs, two ways:
    - `lags`: how late a 1 ms sleep wakes up. This also counts asyncio's timer resolution: the loop waits in
      epoll for whole milliseconds, rounded up, so a sleep whose remaining time is a few microseconds when some
      other event wakes the loop may wait up to 1 ms more. With a no-op event every 2.3 ms and no other work the
      p99 reads 1.26 ms on the dev box (benchmarks/RESULTS.md, 2026-11-26 16:58-17:52).
    - `delays`: how long an event waits for the loop: a thread posts a callback every millisecond (as a socket
      becoming readable wakes the loop at once) and the time from posting to running is recorded. This is what
      an arriving HTTP request or engine message waits for."""
    loop = asyncio.get_running_loop()
    done = threading.Event()

    def ran(posted: float) -> None:
        delays.append(time.perf_counter() - posted)

    def post() -> None:
        while not done.wait(0.001):
            loop.call_soon_threadsafe(ran, time.perf_counter())

    poster = threading.Thread(target=post, name="loop-delay-probe", daemon=True)
    poster.start()
    try:
        while not stop.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - t - 0.001)
    finally:
        done.set()
        await asyncio.to_thread(poster.join)


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def engine_config(folder: Path, device: str, s: Sizes) -> Any:
    """The engine phase's EngineConfig: up to `s.batch` sequences, KV room for twice that many requests and at least
    one context window (the engine refuses less: http_vs_core's CUDA smoke of 4 streams asked for 192 of 256); the
    tokens a step are the engine's default for the model, as users get them (until 2026-11-29: 4096 on both sides)."""
    from runtime.config import EngineConfig

    kv_tokens = max(s.batch * (s.prompt + s.output) * 2, s.max_model_len)
    return EngineConfig(model=str(folder), device=device, dtype="bfloat16", max_batch_size=s.batch,
                        max_kv_tokens=kv_tokens,
                        max_model_len=s.max_model_len, enable_prefix_caching=False)


async def engine_phase(folder: Path, out: Path, profile: bool, device: str = "cuda",
                       sizes: Sizes = FULL, load: bool = True) -> dict[str, Any]:
    from benchmarks.core_consumers import closed_loop_processes
    from runtime.native.decode_rows import IDS, LENGTHS, PREV, SLOTS
    from runtime.native.llm_engine import NativeEngine
    from runtime.process.client import EngineClient

    res: dict[str, Any] = {}
    s = sizes
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    cfg = engine_config(folder, device, s)
    t0 = time.perf_counter()
    engine = NativeEngine(cfg)
    await engine.start()
    await engine.warmed_up()  # the CPU's compiled steps, built while eager ones serve
    res["load_s"] = time.perf_counter() - t0
    seed = iter(range(1000, 10**6))
    try:
        # warm-up: every prefill shape class and a full batch of decodes
        await asyncio.gather(*(_stream(engine, _request(f"w{i}", p, 8))
                               for i, p in enumerate(gm.random_prompts(s.batch, s.prompt, vocab, next(seed)))))
        # decode at batch 1, 128-token context: inter-token gaps as the caller sees them
        _, arr, _ = await _stream(engine, _request("itl", gm.random_prompts(1, s.prompt, vocab, next(seed))[0], 65))
        gaps = [b - a for a, b in zip(arr[1:], arr[2:])]
        res["decode_b1_itl_ms_p50"] = statistics.median(gaps) * 1e3
        res["decode_b1_itl_ms_mean"] = statistics.mean(gaps) * 1e3
        graphs = engine.runner.graphs  # on the CPU: compiled decode steps, not graphs
        if graphs is not None and torch.device(device).type == "cuda":  # GPU time of the batch-1 graph alone
            # (nothing stored: slot -1)
            packed, _ = graphs.host_views(0)  # what the graph copies in (set 0)
            packed[IDS, :1], packed[SLOTS, :1], packed[LENGTHS, :1], packed[PREV, :1] = 0, -1, s.prompt, -1
            g = graphs.base[0][1]
            res["decode_b1_graph_gpu_ms"] = ms_per_call(g.replay, 100, warmup=5)
            try:
                res["decode_b1_kernels"] = _graph_kernels(g, out / "profile_b1.txt")
                prompt = gm.random_prompts(1, s.prompt, vocab, next(seed))[0]
                res["decode_b1_timeline"] = await _device_timeline(engine, prompt, 33, out / "timeline_b1.txt")
                res["decode_b1_steps"] = await _ttft_steps(engine, prompt, out / "profile_b1_steps.txt", tokens=33)
            except Exception as exc:  # noqa: BLE001 - a profiler failure must not lose the phase's figures
                res["decode_b1_kernels"] = {"error": repr(exc)}
        # TTFT of a 1024-token prompt at concurrency 1
        ttfts = []
        for p in gm.random_prompts(6, s.ttft_prompt, vocab, next(seed)):
            t, arr, _ = await _stream(engine, _request(f"ttft{len(ttfts)}", p, 1))
            ttfts.append(arr[0] - t)
        res[f"ttft_{s.ttft_prompt}_ms_p50"] = statistics.median(ttfts[1:]) * 1e3
        res[f"ttft_{s.ttft_prompt}_ms_all"] = [x * 1e3 for x in ttfts]
        res["ttft_steps"] = await _ttft_steps(engine, gm.random_prompts(1, s.ttft_prompt, vocab, next(seed))[0],
                                              out / "profile_ttft.txt")
        if not load:  # --skip engine_load: the latency figures alone (decode batch 1, TTFT), in seconds
            return res
        # throughput: 256 requests of 128 in / 128 out, all submitted at once
        prompts = gm.random_prompts(s.batch, s.prompt, vocab, next(seed))
        it0 = engine.stats().iterations
        t = time.perf_counter()
        done = await asyncio.gather(*(_stream(engine, _request(f"tp{i}", p, s.output))
                                      for i, p in enumerate(prompts)))
        wall = time.perf_counter() - t
        res[f"throughput_{s.batch}_tok_s"] = sum(d[2] for d in done) / wall
        res[f"throughput_{s.batch}_wall_s"] = wall
        res[f"throughput_{s.batch}_steps"] = engine.stats().iterations - it0
        # 64 closed-loop streams for 15 s, with the event loop's lag measured alongside
        res.update(await _closed_loop(engine, s, vocab, next(seed)))
        if profile:
            res["profile"] = await _profile(engine, s, vocab, next(seed), out)
    finally:
        await engine.shutdown()
        del engine
        if torch.cuda.is_available():  # its memory back before the next engine (a CPU smoke's is small)
            gc.collect()
            torch.cuda.empty_cache()
    # The engine core in its own process (what the server runs by default; this loop only reads its outputs),
    # then the in-process engine with async scheduling off (each step waits for its tokens before the next is
    # prepared), then also without CUDA graphs (same kernels, launched eagerly).
    variants: list[tuple[str, Any, bool]] = [
        ("client", lambda: EngineClient(cfg), True),
        ("sync", lambda: NativeEngine(dataclasses.replace(cfg, async_scheduling=False)), True)]
    if torch.device(device).type == "cuda":
        variants.append(("no_graphs", lambda: NativeEngine(dataclasses.replace(
            cfg, async_scheduling=False, enable_cuda_graphs=False)), False))
    for label, make, throughput in variants:
        engine = make()
        await engine.start()
        await engine.warmed_up()
        try:
            p = gm.random_prompts(2, s.prompt, vocab, next(seed))
            await _stream(engine, _request(f"{label}-warm", p[0], 8))
            _, arr, _ = await _stream(engine, _request(f"{label}-itl", p[1], 65))
            res[f"decode_b1_itl_ms_p50_{label}"] = statistics.median([b - a for a, b in zip(arr[1:], arr[2:])]) * 1e3
            ttfts = []
            for i, q in enumerate(gm.random_prompts(4, s.ttft_prompt, vocab, next(seed))):
                t, arr, _ = await _stream(engine, _request(f"{label}-ttft{i}", q, 1))
                ttfts.append(arr[0] - t)
            res[f"ttft_{s.ttft_prompt}_ms_p50_{label}"] = statistics.median(ttfts[1:]) * 1e3
            if throughput:
                prompts = gm.random_prompts(s.batch, s.prompt, vocab, next(seed))
                await asyncio.gather(*(_stream(engine, _request(f"{label}-w{i}", q, 8)) for i, q in enumerate(prompts)))
                t = time.perf_counter()
                done = await asyncio.gather(*(_stream(engine, _request(f"{label}-tp{i}", q, s.output))
                                              for i, q in enumerate(prompts)))
                res[f"throughput_{s.batch}_tok_s_{label}"] = sum(d[2] for d in done) / (time.perf_counter() - t)
            if label == "client":
                res.update({f"{k}_client": v for k, v in (await _closed_loop(engine, s, vocab, next(seed))).items()})
                if s.consumer_processes == 1:  # (SMOKE) the one-process round below on this core, not a new one
                    res.update(await closed_loop_processes(cfg, s, vocab, next(seed), 1, engine))
        finally:
            await engine.shutdown()
            del engine
            if torch.cuda.is_available():
                gc.collect()
                torch.cuda.empty_cache()
    # the engine core under the shape of the HTTP load at 256 streams (closed loop, several client processes)
    if s.consumer_processes > 1:
        res.update(await closed_loop_processes(cfg, s, vocab, next(seed), s.consumer_processes))
    return res


async def _closed_loop(engine: Any, s: Sizes, vocab: int, seed: int, label: str = "") -> dict[str, Any]:
    """`s.streams` closed-loop streams for `s.closed_loop_s` (request ids start with `label`), with this event
    loop's lag measured alongside."""
    streams = s.streams
    prompts = gm.random_prompts(4 * streams, s.prompt, vocab, seed)
    rng = random.Random(seed)
    lengths = [normal_length(rng, s.output, s.output_std) for _ in prompts]
    stop_at = time.perf_counter() + s.closed_loop_s
    tokens = 0
    stop = asyncio.Event()
    lags: list[float] = []
    delays: list[float] = []
    ttfts: list[float] = []
    tpots: list[float] = []  # per request: time per output token after the first
    e2es: list[float] = []  # per request: submit to its last output
    gaps: list[float] = []  # per request after a stream's first: the stream's previous request done to this submit

    async def worker(w: int) -> None:
        nonlocal tokens
        i = w
        done: float | None = None
        while time.perf_counter() < stop_at:
            t0, arrivals, n = await _stream(engine, _request(f"{label}cl{w}-{i}", prompts[i % len(prompts)],
                                                             lengths[i % len(prompts)]))
            if done is not None:
                gaps.append(t0 - done)
            done = time.perf_counter()
            tokens += n
            ttfts.append(arrivals[0] - t0)
            e2es.append(arrivals[-1] - t0)
            if n > 1:
                tpots.append((arrivals[-1] - arrivals[0]) / (n - 1))
            i += streams

    lag_task = asyncio.create_task(_loop_lag(stop, lags, delays))
    t = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(streams)))
    wall = time.perf_counter() - t
    stop.set()
    await lag_task
    return {f"closed_loop_{streams}_tok_s": tokens / wall, "ttft_ms_p50": _pct(ttfts, 0.5) * 1e3,
            "tpot_ms_p50": _pct(tpots, 0.5) * 1e3, "e2e_ms_p50": _pct(e2es, 0.5) * 1e3,
            "gap_ms_p50": _pct(gaps, 0.5) * 1e3,
            "event_loop_lag_ms_p50": _pct(lags, 0.5) * 1e3, "event_loop_lag_ms_p99": _pct(lags, 0.99) * 1e3,
            "event_loop_delay_ms_p50": _pct(delays, 0.5) * 1e3, "event_loop_delay_ms_p99": _pct(delays, 0.99) * 1e3}


async def _ttft_steps(engine: Any, prompt: list[int], path: Path, tokens: int = 1) -> dict[str, Any]:
    """Where one request's time goes (by default one prompt's TTFT): each engine step's wall time, and the kernel
    time summed over them (torch.profiler's CUDA activity covers every thread): GPU-bound when close to the
    steps' wall time, host-bound when far under it; the kernel table and the host's profile go to `path`."""
    from torch.profiler import ProfilerActivity, profile

    steps: list[float] = []
    busy = False
    original = engine.step
    py_prof = cProfile.Profile()  # the host side by Python function (blocking calls included)

    def timed_step() -> int:
        nonlocal busy
        busy = True
        t = time.perf_counter()
        py_prof.enable()  # in the engine thread: cProfile sees the thread that enables it
        n = original()
        py_prof.disable()
        steps.append(time.perf_counter() - t)
        busy = False
        return n

    activities = [ProfilerActivity.CUDA] if torch.cuda.is_available() else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        engine.step = timed_step
        try:
            t, arr, _ = await _stream(engine, _request("ttft-profiled", prompt, tokens))
            while busy:  # the step that delivered the token is still returning
                await asyncio.sleep(0.001)
        finally:
            del engine.step
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    text = io.StringIO()
    stats = pstats.Stats(py_prof, stream=text)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(40)
    path.write_text(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=30) + "\n\n" + text.getvalue())
    entries = stats.stats.items()  # type: ignore[attr-defined]
    return {"ttft_ms": (arr[0] - t) * 1e3, "step_ms": [round(x * 1e3, 3) for x in steps],
            "kernel_ms": sum(e.self_device_time_total for e in kernels) / 1e3, "kernels": sum(e.count for e in kernels),
            "top_kernels": [(e.key[:60], round(e.self_device_time_total / 1e3, 3), e.count)
                            for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:10]],
            "top_host_ms": [(f"{Path(k[0]).name}:{k[1]}:{k[2]}", round(v[2] * 1e3, 3), v[1])
                            for k, v in sorted(entries, key=lambda kv: -kv[1][2])[:12]]}


async def _device_timeline(engine: Any, prompt: list[int], tokens: int, path: Path) -> dict[str, Any]:
    """Is a request's decode bound by the GPU or by the host? Every device operation while it runs (torch.profiler,
    CUDA activity only: no host tracing to slow the host down): the fraction of the time the device is busy,
    its busy time per token, and the longest idle gaps with the operations on either side (to `path`)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _, arr, _ = await _stream(engine, _request("timeline", prompt, tokens))
        torch.cuda.synchronize()
    ops = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                 if e.device_type == torch.autograd.DeviceType.CUDA)
    busy, end, gaps = 0.0, ops[0][0], []
    for i, (start, stop, _) in enumerate(ops):
        if start > end:
            gaps.append((start - end, ops[i - 1][2][:50], ops[i][2][:50]))
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    span = end - ops[0][0]
    gaps.sort(reverse=True)
    path.write_text("\n".join(f"{gap:9.1f} us idle after {a!r} before {b!r}" for gap, a, b in gaps[:60]))
    decode = [b - a for a, b in zip(arr[1:], arr[2:])]
    return {"itl_ms_p50": statistics.median(decode) * 1e3, "device_busy_fraction": busy / span,
            "device_busy_ms_per_token": busy / 1e3 / len(arr), "idle_gaps_us_top5": [round(g[0], 1) for g in gaps[:5]],
            "idle_us_total": round(span - busy, 1), "ops": len(ops)}


def _graph_kernels(graph: Any, path: Path, replays: int = 10) -> dict[str, Any]:
    """Kernels of one graph replay (torch.profiler sees inside CUDA graphs): their count and summed GPU time
    per replay, against which the replay's wall time shows the gaps between them; the table goes to `path`."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    path.write_text(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=40))
    return {"kernels_per_replay": sum(e.count for e in kernels) / replays,
            "kernel_ms_per_replay": sum(e.self_device_time_total for e in kernels) / 1e3 / replays,
            "top": [(e.key[:60], round(e.self_device_time_total / 1e3 / replays, 4), e.count // replays)
                    for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:12]]}


async def _profile(engine: Any, s: Sizes, vocab: int, seed: int, out: Path) -> dict[str, Any]:
    """A batch-256 run (128 in / 64 out) with every engine step timed, and torch.profiler over 20 of its
    decode steps, entered inside the engine thread (the profiler records the thread that starts it)."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else []))
    py_prof = cProfile.Profile()  # the host side by Python function, over the next 20 steps
    steps: list[tuple[int, float]] = []  # (sequences run, seconds)
    original = engine.step

    def timed_step() -> int:
        if len(steps) == 12:
            prof.__enter__()
        elif len(steps) == 32:
            py_prof.enable()
        t = time.perf_counter()
        n = original()
        steps.append((n, time.perf_counter() - t))
        if len(steps) == 32:
            prof.__exit__(None, None, None)
        elif len(steps) == 52:
            py_prof.disable()
        return n

    engine.step = timed_step
    try:
        prompts = gm.random_prompts(s.batch, s.prompt, vocab, seed)
        await asyncio.gather(*(_stream(engine, _request(f"pr{i}", p, 64)) for i, p in enumerate(prompts)))
    finally:
        del engine.step
    ka = prof.key_averages()
    device_key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    text = io.StringIO()
    stats = pstats.Stats(py_prof, stream=text)
    stats.sort_stats("cumulative").print_stats(60)
    stats.sort_stats("tottime").print_stats(30)
    (out / "profile.txt").write_text(ka.table(sort_by="self_cpu_time_total", row_limit=40) + "\n\n"
                                     + ka.table(sort_by=device_key, row_limit=30) + "\n\n" + text.getvalue())
    decode = [t for n, t in steps[12:32] if n == s.batch]
    entries = stats.stats.items()  # type: ignore[attr-defined]
    host = {f"{Path(k[0]).name}:{k[2]}": round(v[3] * 1e3 / 20, 3) for k, v in entries if k[2] in _HOST_FUNCTIONS}
    return {"step_ms_by_batch": [(n, round(t * 1e3, 3)) for n, t in steps],
            f"decode{s.batch}_step_ms_p50": statistics.median(decode) * 1e3 if decode else None,
            "host_ms_per_step_cumulative": host,
            "top_cpu_ms": [(e.key, round(e.self_cpu_time_total / 1e3, 2), e.count) for e in
                           sorted(ka, key=lambda e: -e.self_cpu_time_total)[:15]],
            "top_cuda_ms": [(e.key, round(e.self_device_time_total / 1e3, 2), e.count) for e in
                            sorted(ka, key=lambda e: -e.self_device_time_total)[:15]]}


# engine-loop functions whose cumulative time per step the profile reports
_HOST_FUNCTIONS = {"step", "schedule", "_run", "_step_inputs", "sampling_rows", "execute", "run", "_sample",
                   "__call__", "update_from_output", "_update_entry", "add_token", "push", "flush", "emit", "put",
                   "publish_stats", "hold_places", "advance", "synchronize"}


def gateway_command(folder: Path, device: str, s: Sizes, streams: int, *extra: str) -> list[str]:
    """`gateway serve` of `folder` for `streams` concurrent streams ("{port}": procs.Server fills it in)."""
    return [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "{port}", "--model", str(folder),
            "--device", device, "--dtype", "bfloat16", "--max-batch-size", str(streams),
            "--max-model-len", str(s.max_model_len),
            "--kv-cache-fraction", "0.3",
            "--no-enable-prefix-caching", "--log-level", "info", "--grpc-port", "none", *extra]


def http_phase(command: list[str], label: str, folder: Path, out: Path, *, tserve: bool, ready: str,
               sizes: Sizes = FULL, streams: int | None = None) -> dict[str, Any]:
    """`streams` (default sizes.streams) concurrent streams of 128 in / 128 out through an HTTP server started
    with `command`; raises (with the server's log tail) when the server or the load fails."""
    with http_server(command, label, out, ready) as server:
        return {"summary": http_load(server, folder, sizes, streams or sizes.streams, tserve=tserve),
                "log_tail": (out / f"{label}.log").read_text()[-3000:]}


@contextmanager
def http_server(command: list[str], label: str, out: Path, ready: str) -> Iterator[Any]:
    """The server started with `command` (its output in OUT/label.log), ready; stopped on exit. An exception
    inside gets the log's tail added."""
    from benchmarks.procs import Server

    log = out / f"{label}.log"
    server = Server("", command=["sh", "-c", "exec " + " ".join(command) + f" > {log} 2>&1"], ready_path=ready)
    try:
        server.wait_ready(timeout=240)
        yield server
    except Exception as exc:  # the phase fails, with the server's log in its error
        tail = log.read_text()[-3000:] if log.exists() else ""
        raise RuntimeError(f"{label} over HTTP failed: {exc!r}; server log tail:\n{tail}") from exc
    finally:
        server.stop()


def client_processes(concurrency: int) -> int:
    """Load-generator processes for `concurrency` streams, one per 8, at most 8, so that the server is what is
    measured. Events alone would need fewer (one process saturates near 30k events/s), but closed-loop streams of
    equal length end together, and each process then sends its share of the next requests one after another:
    with 2 processes for 64 streams the clients saw 66-85 ms to the first token against the engine core's 33-38 ms;
    with 8, 39-44 ms against 32-40 ms (H200, one machine, 2026-11-27, benchmarks/RESULTS.md)."""
    return min(8, max(1, concurrency // 8))


def http_load(server: Any, folder: Path, s: Sizes, concurrency: int, *, tserve: bool = False,
              clients: int | None = None) -> dict[str, Any]:
    """`concurrency` closed-loop streams for `s.http_s` from the load generator (`clients` processes, by default
    `client_processes(concurrency)`); its summary. Raises when a request failed."""
    from benchmarks.procs import run_load_generator

    if tserve:  # exact lengths through a per-request generation_config (it rejects unknown fields)
        gen = {"do_sample": False, "min_new_tokens": s.output, "max_new_tokens": s.output}
        extra = ["--no-ignore-eos", "--model", str(folder), "--extra-body",
                 json.dumps({"generation_config": json.dumps(gen)})]
    else:
        extra = ["--extra-body", json.dumps({"temperature": 0})]
    argv = ["--base-url", server.base_url, "--api", "completions", "--tokenizer", str(folder),
            "--concurrency", str(concurrency), "--num-prompts", str(max(s.batch, concurrency)), "--input-mean", str(s.prompt),
            "--input-std", "0", "--output-mean", str(s.output), "--output-std", str(s.output_std), "--duration", str(s.http_s),
            "--warmup", str(concurrency),
            "--client-processes", str(clients or client_processes(concurrency))] + extra
    summary = run_load_generator(argv, timeout=300)["points"][0]["summary"]
    if not summary["completed"] or summary["failed"]:
        raise RuntimeError(f"{summary['failed']} of {summary['completed'] + summary['failed']} requests failed: {summary['errors']}")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="/tmp/gpu_bench", help="folder for gpu_bench.json, profile.txt, server logs")
    p.add_argument("--work", default="/tmp/gpu_bench_models", help="folder for the random checkpoints")
    p.add_argument("--skip", default="", help="comma list of phases to skip (see above)")
    p.add_argument("--device", default="cuda", help="cuda, or cpu (with --smoke: proves the code runs)")
    p.add_argument("--smoke", action="store_true", help="tiny model, tiny loads, seconds per phase (SMOKE)")
    args = p.parse_args(argv)
    out, work, device = Path(args.out), Path(args.work), args.device
    sizes = SMOKE if args.smoke else FULL
    out.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))
    on_cuda = torch.device(device).type == "cuda"
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if on_cuda else device, "torch": torch.__version__,
        "command": "python -m benchmarks.gpu_bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "sizes": asdict(sizes)}
    try:
        results["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                           text=True).stdout.strip()
    except OSError:
        pass
    failed: list[str] = []

    def phase(name: str, fn: Any, ok: Any = lambda r: True) -> None:
        """Run and record one phase; one that raises, or whose result `ok` rejects, fails the run at the end."""
        if name in skip:
            return
        t = time.perf_counter()
        try:
            results[name] = fn()
            if not ok(results[name]):
                failed.append(name)
                print(f"[{name}] FAILED its check: {json.dumps(results[name], default=str)[:1500]}",
                      file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 - recorded, the later phases still run, and the run fails at the end
            failed.append(name)
            results[name] = {"error": traceback.format_exc()[-3000:]}
            print(f"[{name}] FAILED\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        results.setdefault("phase_s", {})[name] = round(time.perf_counter() - t, 1)
        results["failed_phases"] = failed
        (out / "gpu_bench.json").write_text(json.dumps(results, indent=1, default=str))
        print(f"[{name}] {time.perf_counter() - t:.1f}s {json.dumps(results[name], default=str)[:1500]}", flush=True)

    s = sizes
    prefix = "smoke-" if args.smoke else ""  # the folders are reused when present: never a tiny one for a full run
    big = gm.make_checkpoint(work / f"{prefix}llama1b", s.big, torch.bfloat16)
    weights = sum(f.stat().st_size for f in big.glob("*.safetensors"))
    phase("bandwidth", lambda: {"tb_s": bandwidth_tb_s(s.copy_gib, device), "weight_bytes": weights})
    if "bandwidth" in results and "tb_s" in results["bandwidth"]:
        results["bandwidth"]["floor_ms"] = weights / results["bandwidth"]["tb_s"] / 1e9
    phase("logits", lambda: gm.check_logits(big, s.logits_prompt, device), ok=lambda r: r["pass"])
    phase("greedy_fp32", lambda: gm.check_greedy_fp32(
        gm.make_checkpoint(work / f"{prefix}small", s.small, torch.float32, init_std=0.08), steps=s.greedy_steps,
        device=device), ok=lambda r: r["equal"])
    phase("hf", lambda: gm.hf_generate(big, torch.bfloat16, s.hf_batch1_tokens, s.streams, s.prompt, s.output, device))
    phase("engine", lambda: asyncio.run(engine_phase(big, out, "profile" not in skip, device, s,
                                                     load="engine_load" not in skip)))

    def gateway(label: str, streams: int, *extra: str) -> dict[str, Any]:
        return http_phase(gateway_command(big, device, s, streams, *extra), label, big, out, tserve=False,
                          ready="/health", sizes=s, streams=streams)

    phase("http", lambda: gateway("gateway", s.streams))  # the engine core in its own process (the default)
    phase("http_batch", lambda: gateway("gateway-batch", s.batch))
    for n in (2, 4):  # several front ends over one engine core
        phase(f"http_api{n}", lambda n=n: gateway(f"gateway-api{n}", s.streams, "--api-servers", str(n)))
    for n in (2, 4):
        phase(f"http_batch_api{n}", lambda n=n: gateway(f"gateway-batch-api{n}", s.batch, "--api-servers", str(n)))
    # two engine cores (one GPU each) behind one front end, against http_batch's one (the 2-GPU machine)
    phase("http_batch_dp2", lambda: gateway("gateway-batch-dp2", s.batch, "--data-parallel-size", "2"))
    phase("http_in_process", lambda: gateway("gateway-in-process", s.streams, "--no-engine-process"))
    phase("tserve", lambda: http_phase(
        ["transformers", "serve", "--continuous-batching", "--device", device, "--dtype", "bfloat16",
         "--host", "127.0.0.1", "--port", "{port}", str(big)], "tserve", big, out, tserve=True, ready="/health",
        sizes=s))
    print(json.dumps(summary(results), indent=1))
    if failed:
        print(f"gpu_bench: FAILED phases: {', '.join(failed)} (tracebacks above and in {out / 'gpu_bench.json'})",
              file=sys.stderr, flush=True)
        return 1
    return 0


def summary(r: dict[str, Any]) -> dict[str, Any]:
    """The headline figures of a results dict (missing ones None)."""
    def get(*path: str) -> Any:
        node: Any = r
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        return node

    s = Sizes(**r["sizes"]) if "sizes" in r else FULL
    return {
        "copy_tb_s": get("bandwidth", "tb_s"), "floor_ms": get("bandwidth", "floor_ms"),
        "logits": get("logits"), "greedy_fp32_equal": get("greedy_fp32", "equal"),
        "hf_b1_step_ms": get("hf", "batch1_step_ms"),
        f"hf_b{s.streams}_tok_s": get("hf", f"batch{s.streams}_output_tok_s"),
        "decode_b1_itl_ms": get("engine", "decode_b1_itl_ms_p50"),
        "decode_b1_graph_ms": get("engine", "decode_b1_graph_gpu_ms"),
        f"ttft_{s.ttft_prompt}_ms": get("engine", f"ttft_{s.ttft_prompt}_ms_p50"),
        f"engine_{s.batch}_tok_s": get("engine", f"throughput_{s.batch}_tok_s"),
        f"engine_{s.streams}_tok_s": get("engine", f"closed_loop_{s.streams}_tok_s"),
        "decode_b1_itl_sync_ms": get("engine", "decode_b1_itl_ms_p50_sync"),
        f"engine_{s.batch}_tok_s_sync": get("engine", f"throughput_{s.batch}_tok_s_sync"),
        "decode_b1_itl_no_graphs_ms": get("engine", "decode_b1_itl_ms_p50_no_graphs"),
        "loop_lag_p99_ms": get("engine", "event_loop_lag_ms_p99"),
        "loop_delay_p99_ms": get("engine", "event_loop_delay_ms_p99"),
        f"engine_client_{s.batch}_tok_s": get("engine", f"throughput_{s.batch}_tok_s_client"),
        f"engine_client_{s.streams}_tok_s": get("engine", f"closed_loop_{s.streams}_tok_s_client"),
        f"engine_client_{s.batch}_closed_loop_tok_s": get("engine", f"closed_loop_{s.batch}_tok_s_client_procs"),
        "decode_b1_itl_client_ms": get("engine", "decode_b1_itl_ms_p50_client"),
        "loop_lag_p99_client_ms": get("engine", "event_loop_lag_ms_p99_client"),
        "loop_delay_p99_client_ms": get("engine", "event_loop_delay_ms_p99_client"),
        f"http_{s.streams}_tok_s": get("http", "summary", "output_token_throughput"),
        f"http_{s.streams}_in_process_tok_s": get("http_in_process", "summary", "output_token_throughput"),
        f"http_{s.batch}_tok_s": get("http_batch", "summary", "output_token_throughput"),
        f"http_{s.streams}_api2_tok_s": get("http_api2", "summary", "output_token_throughput"),
        f"http_{s.streams}_api4_tok_s": get("http_api4", "summary", "output_token_throughput"),
        f"http_{s.batch}_api2_tok_s": get("http_batch_api2", "summary", "output_token_throughput"),
        f"http_{s.batch}_api4_tok_s": get("http_batch_api4", "summary", "output_token_throughput"),
        f"http_{s.batch}_dp2_tok_s": get("http_batch_dp2", "summary", "output_token_throughput"),
        f"tserve_{s.streams}_tok_s": get("tserve", "summary", "output_token_throughput"),
    }


if __name__ == "__main__":
    sys.exit(main())
