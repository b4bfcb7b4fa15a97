"""Async scheduling (the engine launches step N+1 before it has collected step N's tokens) changes no output.

The same mixed workload runs with `async_scheduling` off and on (on the CPU the launch is synchronous, but
every piece of the bookkeeping runs: PENDING_TOKEN places, ids read from the previous launch on the device,
stop conditions seen one step late, the extra token discarded). Outputs must be equal token for token,
text for text, with the same finish reasons and usage, and match transformers' greedy ids; the KV blocks
must all come back.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from runtime.native.model_runner import PendingStep
from runtime.request import GenerationRequest, SamplingOptions
from tests.engine_harness import Collected, collect, hf_greedy, load_hf, request, running_engine
from tests.tiny_models import build_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    path = build_tiny_model(tmp_path_factory.mktemp("async"), "llama")
    return path, load_hf(path)


def _prompts(lengths: list[int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 300) for _ in range(n)] for n in lengths]


class LaunchLog:
    """Records, in order, every launch and every collect of the engine's model runner."""

    def __init__(self, engine: Any) -> None:
        self.events: list[tuple[str, int]] = []
        runner = engine.runner
        launch = runner.launch

        def logged_launch(*args: Any, **kwargs: Any) -> PendingStep:
            pending = launch(*args, **kwargs)
            number = sum(1 for kind, _ in self.events if kind == "launch")
            self.events.append(("launch", number))
            collect_inner = pending.collect

            def logged_collect() -> Any:
                self.events.append(("collect", number))
                return collect_inner()

            pending.collect = logged_collect  # type: ignore[method-assign]
            return pending

        runner.launch = logged_launch

    def overlapped(self) -> int:
        """Launches that happened while an earlier step was still uncollected."""
        open_steps: set[int] = set()
        count = 0
        for kind, number in self.events:
            if kind == "launch":
                count += bool(open_steps)
                open_steps.add(number)
            else:
                open_steps.discard(number)
        return count


async def _workload(path: Path, async_scheduling: bool, ref_stop: int) -> tuple[dict[str, Collected], int]:
    """Greedy requests joining at different steps (prefix-sharing ones among them), a stop token, a seeded
    sampled one, n = 2 and a penalty (both run synchronously), a greedy one asking for logprobs, one aborted
    mid-stream. On CUDA the decode graphs' own argmax serves the steps where every row is plain greedy, and
    the sampler the others."""
    ps = _prompts([5, 23, 9, 14, 3, 30], seed=4)
    shared = ps[1][:16]
    async with running_engine(path, async_scheduling=async_scheduling, max_num_tokens=16) as engine:
        log = LaunchLog(engine)
        first = {
            "a": request("a", ps[0], 24),
            "b": request("b", ps[1], 19),
            "c": request("c", shared + ps[2], 13),  # shares the first 16 tokens of b: prefix-cache hits
        }
        later = {
            "stop": request("stop", ps[3], 20, stop_token_ids=[ref_stop]),
            "seeded": request("seeded", ps[4], 15, temperature=0.8, seed=7),
            "n2": request("n2", ps[2], 6, n=2),
            "penalty": request("penalty", ps[5], 9, repetition_penalty=1.3),
            "logprobs": request("logprobs", ps[0], 12, logprobs=2),  # greedy, but the sampler reports logprobs
        }
        started = asyncio.Event()
        tasks = {rid: asyncio.create_task(collect(engine, r, started=started if rid == "a" else None,
                                                  after_tokens=4)) for rid, r in first.items()}
        await started.wait()
        tasks |= {rid: asyncio.create_task(collect(engine, r)) for rid, r in later.items()}

        aborted = Collected()

        async def abort_after_three() -> Collected:
            async for d in engine.generate(request("aborted", ps[0], 40)):
                aborted.add(d)
                if sum(map(len, aborted.tokens.values())) >= 3:
                    break
            return aborted

        tasks["aborted"] = asyncio.create_task(abort_after_three())
        outs = {rid: await t for rid, t in tasks.items()}
        await asyncio.sleep(0.05)  # the abort reaches the step thread
        for _ in range(200):
            if engine.block_manager.num_used_blocks == 0:
                break
            await asyncio.sleep(0.01)
        assert engine.block_manager.num_used_blocks == 0
    return outs, log.overlapped()


def same_logprobs(a: dict[int, float | None], b: dict[int, float | None]) -> bool:
    """Equal per sample: both None (a request without logprobs), or within 1e-4 of each other. (pytest.approx
    of a dict holding None raises on pytest 9.2.)"""
    return a.keys() == b.keys() and all(
        (a[i] is None and b[i] is None) or (None not in (a[i], b[i]) and a[i] == pytest.approx(b[i], rel=1e-4))
        for i in a)


async def test_outputs_are_the_same_with_and_without_async_scheduling(model) -> None:
    path, hf = model
    stop_prompt = _prompts([5, 23, 9, 14], seed=4)[3]
    ref = hf_greedy(hf, stop_prompt, 20)
    k = next(i for i in range(4, 20) if ref[i] not in ref[:i])
    sync, sync_overlaps = await _workload(path, False, ref[k])
    overlapped, overlaps = await _workload(path, True, ref[k])
    assert sync_overlaps == 0 and overlaps > 0
    for rid in sync:
        a, b = sync[rid], overlapped[rid]
        if rid == "aborted":  # where the abort lands may differ by a step; what came before it may not
            n = min(len(a.tokens[0]), len(b.tokens[0]))
            assert n >= 3 and a.tokens[0][:n] == b.tokens[0][:n]
            continue
        assert (a.tokens, a.text, a.finish, a.stop_reason) == (b.tokens, b.text, b.finish, b.stop_reason), rid
        assert a.usage == b.usage and same_logprobs(a.cumulative_logprob, b.cumulative_logprob), rid
    assert overlapped["stop"].tokens[0] == ref[: k + 1] and overlapped["stop"].finish == {0: "stop"}
    assert overlapped["a"].tokens[0] == hf_greedy(hf, _prompts([5], seed=4)[0], 24)


async def test_every_step_of_a_lone_request_but_the_first_overlaps_the_previous_one(model) -> None:
    path, hf = model
    prompt = _prompts([6], seed=5)[0]
    async with running_engine(path, async_scheduling=True) as engine:
        log = LaunchLog(engine)
        out = await collect(engine, request("x", prompt, 12))
    assert out.tokens[0] == hf_greedy(hf, prompt, 12)
    # 12 launches (no extra one: the host knows the 12th token is the last); each later one went out
    # before the previous step's tokens were collected
    assert [kind for kind, _ in log.events].count("launch") == 12
    assert log.overlapped() == 11


async def test_a_step_that_fails_in_flight_fails_only_its_requests(model) -> None:
    path, hf = model
    prompt = _prompts([6], seed=9)[0]
    async with running_engine(path, async_scheduling=True) as engine:
        runner = engine.runner
        launch = runner.launch
        calls = 0

        def failing_collect_on_the_fifth_step(*args: Any, **kwargs: Any) -> PendingStep:
            nonlocal calls
            calls += 1
            pending = launch(*args, **kwargs)
            if calls == 5:
                def broken() -> Any:
                    raise RuntimeError("device fault")
                pending.collect = broken  # type: ignore[method-assign]
            return pending

        runner.launch = failing_collect_on_the_fifth_step
        out = await collect(engine, request("x", prompt, 12))
        assert out.finish == {0: "error"} and "device fault" in (out.deltas[-1].error or "")
        runner.launch = launch
        again = await collect(engine, GenerationRequest("y", prompt_token_ids=prompt, sampling=SamplingOptions(
            max_tokens=12, temperature=0.0, ignore_eos=True)))
        assert again.tokens[0] == hf_greedy(hf, prompt, 12)
        assert engine.block_manager.num_used_blocks == 0
