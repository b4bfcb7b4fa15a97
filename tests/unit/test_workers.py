"""WorkerPool, and the native engine preparing large requests (prompt, bad words) off the event loop.

The blocking tests hold a tokenizer call on a threading.Event that only the event loop can set: before
the work left the loop, the call held it and the Event's wait ran out instead (the server froze for
14.9 s on 25,000 Triton bad_words, measured 2026-11-24).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from runtime.errors import InvalidRequestError
from runtime.request import GenerationRequest, SamplingOptions
from runtime.workers import HEAVY_CHARS, WorkerPool, is_heavy
from tests.engine_harness import collect, running_engine
from tests.tiny_models import build_tiny_model

HELD_FOR = 60.0  # seconds a blocked call waits for the loop before giving up (only reached on failure)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("workers"), "llama")


async def test_light_calls_run_inline_and_heavy_ones_in_a_worker_thread() -> None:
    pool = WorkerPool("test-pool", threads=1)
    try:
        here = threading.current_thread().name
        assert await pool.call(False, lambda: threading.current_thread().name) == here
        assert (await pool.call(True, lambda: threading.current_thread().name)).startswith("test-pool")
        with pytest.raises(ZeroDivisionError):  # errors come back to the caller
            await pool.call(True, lambda: 1 / 0)
    finally:
        pool.shutdown()


def test_heaviness_counts_prompt_and_bad_words() -> None:
    def req(prompt: str = "hi", words: list[str] | None = None) -> GenerationRequest:
        return GenerationRequest("r", prompt=prompt, sampling=SamplingOptions(bad_words=words or []))

    assert not is_heavy(req())
    assert is_heavy(req("x" * (HEAVY_CHARS + 1)))
    assert is_heavy(req(words=[f"w{i}" for i in range(65)]))
    assert not is_heavy(req(words=["a", "b"]))


def _hold_large_batches(tokenizer, loop_released: threading.Event, outcome: list[bool]) -> None:
    """Make the tokenizer's batch call wait, for batches of more than 100 texts, until the loop releases it."""
    real = tokenizer.encode_many

    def encode_many(texts, add_special_tokens=True):  # type: ignore[no-untyped-def]
        if len(texts) > 100:
            outcome.append(loop_released.wait(HELD_FOR))
        return real(texts, add_special_tokens)

    tokenizer.encode_many = encode_many


async def test_engine_tokenizes_many_bad_words_off_the_event_loop(checkpoint: Path) -> None:
    async with running_engine(checkpoint) as engine:
        released, outcome = threading.Event(), []
        _hold_large_batches(engine.tokenizer, released, outcome)
        words = [f"word{i}" for i in range(300)]
        req = GenerationRequest("heavy", prompt="hello", sampling=SamplingOptions(max_tokens=2, bad_words=words))
        task = asyncio.create_task(collect(engine, req))
        while not outcome and not task.done():  # the loop runs on while the words are tokenized ...
            await asyncio.sleep(0.01)
            released.set()  # ... so it can release the held call
        out = await task
        assert outcome == [True]
        assert out.finish == {0: "length"}


async def test_prompt_longer_than_the_context_can_hold_is_rejected_without_tokenizing(checkpoint: Path) -> None:
    async with running_engine(checkpoint) as engine:
        calls = []
        real = engine.tokenizer.encode_many
        engine.tokenizer.encode_many = lambda texts, add=True: calls.append(texts) or real(texts, add)
        window, most = engine.model_info.context_window, engine.tokenizer.max_token_chars
        prompt = "a" * (2 * window * most + 1)
        req = GenerationRequest("long", prompt=prompt, sampling=SamplingOptions(max_tokens=1))
        with pytest.raises(InvalidRequestError) as info:
            await collect(engine, req)
        assert info.value.param == "prompt"
        assert str(info.value).startswith(f"This model's maximum context length is {window} tokens.")
        assert calls == []
