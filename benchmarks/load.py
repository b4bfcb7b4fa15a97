"""The load pattern: a closed loop at fixed concurrency, or Poisson arrivals at a request rate (with an
optional cap on requests in flight), over keep-alive HTTP/1.1 connections (one per request in flight)."""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import random
import ssl
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from benchmarks.backends import RequestResult, Target, send
from benchmarks.dataset import Prompt
from benchmarks.grpc_client import GrpcPool


@dataclass(frozen=True)
class LoadSpec:
    """How much load and for how long. Prompts are cycled when more requests than prompts are sent."""

    concurrency: int | None = 1  # closed loop: this many in flight; with `rate`: the cap (None: none)
    rate: float | None = None  # Poisson arrivals per second; None: closed loop
    num_requests: int | None = None  # stop after this many; None with no duration: one per prompt
    duration_s: float | None = None  # stop starting requests after this many seconds
    warmup: int = 0  # requests sent (and discarded) before measuring
    seed: int = 0
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.rate is None and not self.concurrency:
            raise ValueError("a closed loop needs a concurrency >= 1")
        if self.rate is not None and self.rate <= 0:
            raise ValueError("the request rate must be > 0")


class ClientPool:
    """Keep-alive HTTP/1.1 connections, one httpx.AsyncClient each, handed out one per request in flight.

    One client per connection rather than one client with a big pool: httpcore scans every pooled
    connection (with a socket syscall each) on every request, which made the client, not the
    server, the bottleneck at 64+ streams (40% of the client's time at 64).
    """

    def __init__(self, target: Target, timeout_s: float) -> None:
        self._target = target
        self._timeout = httpx.Timeout(timeout_s)
        self._free: list[httpx.AsyncClient] = []
        self._all: list[httpx.AsyncClient] = []
        # one TLS context for all: building one loads the CA store (~10 ms), per client that adds up
        self._ssl = ssl.create_default_context()

    def prefill(self, n: int) -> None:
        """Create clients up front, so their construction is not timed."""
        while len(self._all) < n:
            self._free.append(self._new_client())  # not acquire(): it would hand back a free one

    def acquire(self) -> httpx.AsyncClient:
        if self._free:
            return self._free.pop()
        return self._new_client()

    def _new_client(self) -> httpx.AsyncClient:
        client = httpx.AsyncClient(
            base_url=self._target.base_url, headers=self._target.headers, timeout=self._timeout, verify=self._ssl,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1), http2=False,
        )
        self._all.append(client)
        return client

    def release(self, client: httpx.AsyncClient) -> None:
        self._free.append(client)

    async def send(self, prompt: Prompt) -> RequestResult:
        client = self.acquire()
        try:
            return await send(client, self._target, prompt)
        finally:
            self.release(client)

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self._all))


async def run_load(
    target: Target,
    prompts: list[Prompt],
    spec: LoadSpec,
    on_result: Callable[[RequestResult], None] | None = None,
    start_together: Any = None,
) -> tuple[list[RequestResult], float, float]:
    """Run the load (after any warmup, and once `start_together`, a barrier of the client processes, lets it);
    returns the results, the wall time from the first send to the last reply, and this process's CPU seconds
    over that time (the client's own cost)."""
    pool: ClientPool | GrpcPool  # grows to the concurrency (or to the peak in flight)
    pool = GrpcPool(target, spec.timeout_s) if target.api == "triton-grpc" else ClientPool(target, spec.timeout_s)
    pool.prefill(spec.concurrency or 0)
    try:
        if spec.warmup:
            warm = itertools.islice(itertools.cycle(prompts), spec.warmup)
            width = min(spec.warmup, spec.concurrency or spec.warmup)
            await _closed_loop(pool, warm, width, None, None)
        if start_together is not None:
            await asyncio.to_thread(start_together.wait, spec.timeout_s)
        num = spec.num_requests if (spec.num_requests or spec.duration_s) else len(prompts)
        source = itertools.cycle(prompts) if num is None else itertools.islice(itertools.cycle(prompts), num)
        t0, cpu0 = time.perf_counter(), time.process_time()
        deadline = t0 + spec.duration_s if spec.duration_s else None
        if spec.rate is None:
            assert spec.concurrency
            results = await _closed_loop(pool, source, spec.concurrency, deadline, on_result)
        else:
            results = await _poisson(pool, source, spec, deadline, on_result)
        return results, time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        await pool.aclose()


def run_load_processes(target: Target, prompts: list[Prompt], spec: LoadSpec, processes: int
                       ) -> tuple[list[RequestResult], float, float]:
    """run_load split over `processes` client processes, for loads one Python process cannot drive (it saturates
    its core near 30k streamed events/s): each takes a share of the concurrency (or rate), the requests and
    the prompts. Returns the merged results, the longest wall time and the processes' CPU seconds summed."""
    shares = []
    for i in range(processes):
        def part(total: int | None) -> int | None:
            return None if total is None else total // processes + (i < total % processes)
        share = LoadSpec(concurrency=part(spec.concurrency), rate=spec.rate / processes if spec.rate else None,
                         num_requests=part(spec.num_requests), duration_s=spec.duration_s,
                         warmup=part(spec.warmup) or 0, seed=spec.seed + i, timeout_s=spec.timeout_s)
        shares.append((prompts[i::processes] or prompts, share))
    # The processes start their measured windows together: each one's window is its own, and the summed tokens
    # are divided by the longest, so processes that came up late (spawned, then warmed up) would leave the
    # server with fewer streams than asked for while the others measure.
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, ProcessPoolExecutor(processes, mp_context=context) as pool:
        barrier = manager.Barrier(processes)
        outs = list(pool.map(_run_share, [target] * processes, *zip(*shares), [barrier] * processes))
    return [r for out in outs for r in out[0]], max(out[1] for out in outs), sum(out[2] for out in outs)


def _run_share(target: Target, prompts: list[Prompt], spec: LoadSpec,
               start_together: Any) -> tuple[list[RequestResult], float, float]:
    return asyncio.run(run_load(target, prompts, spec, start_together=start_together))


async def _closed_loop(
    pool: ClientPool | GrpcPool,
    source: Iterator[Prompt],
    concurrency: int,
    deadline: float | None,
    on_result: Callable[[RequestResult], None] | None,
) -> list[RequestResult]:
    results: list[RequestResult] = []

    async def worker() -> None:
        # `source` is shared: each worker takes the next prompt when its previous request is done
        replied: float | None = None
        while deadline is None or time.perf_counter() < deadline:
            prompt = next(source, None)
            if prompt is None:
                return
            r = await pool.send(prompt)
            if replied is not None:
                r.gap = r.start - replied
            replied = time.perf_counter()
            results.append(r)
            if on_result:
                on_result(r)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


async def _poisson(
    pool: ClientPool | GrpcPool,
    source: Iterator[Prompt],
    spec: LoadSpec,
    deadline: float | None,
    on_result: Callable[[RequestResult], None] | None,
) -> list[RequestResult]:
    assert spec.rate is not None
    rng = random.Random(spec.seed)
    cap = asyncio.Semaphore(spec.concurrency) if spec.concurrency else None
    results: list[RequestResult] = []

    async def one(prompt: Prompt) -> None:
        if cap is None:
            r = await pool.send(prompt)
        else:
            async with cap:
                r = await pool.send(prompt)
        results.append(r)
        if on_result:
            on_result(r)

    tasks = []
    next_at = time.perf_counter()
    for prompt in source:
        delay = next_at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if deadline is not None and time.perf_counter() >= deadline:
            break
        tasks.append(asyncio.create_task(one(prompt)))
        next_at += rng.expovariate(spec.rate)
    await asyncio.gather(*tasks)
    return results
