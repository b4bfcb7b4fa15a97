"""BatchEncoder: prompts that arrive together are encoded in one batch call, off the loop when it pays, each
with exactly the ids Tokenizer.encode gives; a refused text fails only its own request."""

from __future__ import annotations

import asyncio
import threading

import pytest

from runtime.batch_encoder import INLINE_CHARS, BatchEncoder
from runtime.tokenizer import Tokenizer

TEXTS = ["Hello world", "the quick brown fox " * 40, "", "ünïcödé ✓ 日本語", "x" * (INLINE_CHARS + 1)]


class Counting(Tokenizer):
    """The test tokenizer, recording the thread and size of each batch call."""

    def __init__(self, inner: Tokenizer) -> None:
        self.__dict__.update(inner.__dict__)
        self.calls: list[tuple[str, int]] = []

    def encode_many(self, texts, add_special_tokens=True):  # type: ignore[no-untyped-def,override]
        self.calls.append((threading.current_thread().name, len(texts)))
        return super().encode_many(texts, add_special_tokens)


@pytest.fixture
def counting(tokenizer: Tokenizer) -> Counting:
    return Counting(tokenizer)


async def test_a_burst_is_one_batch_call_in_the_worker_with_the_ids_of_encode(counting: Counting) -> None:
    encoder = BatchEncoder(counting)
    try:
        got = await asyncio.gather(*(encoder.encode(t, add_special_tokens=i % 2 == 0) for i, t in enumerate(TEXTS)))
    finally:
        encoder.shutdown()
    assert got == [counting.encode(t, add_special_tokens=i % 2 == 0) for i, t in enumerate(TEXTS)]
    batch_calls = counting.calls[:2]  # one per add_special_tokens value, then the reference's own
    assert [n for _, n in batch_calls] == [3, 2]
    assert all(name.startswith("encode") for name, _ in batch_calls)


async def test_a_lone_short_prompt_is_encoded_inline(counting: Counting) -> None:
    encoder = BatchEncoder(counting)
    try:
        assert await encoder.encode("Hello world") == counting.encode("Hello world")
    finally:
        encoder.shutdown()
    assert counting.calls[0] == (threading.current_thread().name, 1)


async def test_a_refused_text_fails_only_its_own_request(counting: Counting) -> None:
    encoder = BatchEncoder(counting)
    try:
        texts = ["fine " * 200, "a lone surrogate \ud800 " * 40, "also fine " * 100]
        got = await asyncio.gather(*(encoder.encode(t) for t in texts), return_exceptions=True)
    finally:
        encoder.shutdown()
    assert got[0] == counting.encode(texts[0]) and got[2] == counting.encode(texts[2])
    assert isinstance(got[1], TypeError)


async def test_a_cancelled_request_leaves_the_others_their_ids(counting: Counting) -> None:
    encoder = BatchEncoder(counting)
    try:
        texts = ["one " * 200, "two " * 200, "three " * 200]
        tasks = [asyncio.ensure_future(encoder.encode(t)) for t in texts]
        await asyncio.sleep(0)  # all three queued
        tasks[1].cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        encoder.shutdown()
    assert isinstance(done[1], asyncio.CancelledError)
    assert done[0] == counting.encode(texts[0]) and done[2] == counting.encode(texts[2])
