"""BatchEncoder: the prompts of requests that arrive together, tokenized in one call off the event loop.

    encoder = BatchEncoder(tokenizer)
    ids = await encoder.encode(prompt, add_special_tokens=True)

Requests come in bursts: a closed loop's streams end in the same engine step and as many new requests arrive
at once. Tokenized one after another on the event loop, each 128-token prompt held the loop for 65-120 us
(dev box, 2026-11-27) while the burst's other requests and every running stream waited. Here the texts
queued during one pass of the loop go to a worker thread as one batch call of the Rust tokenizer, which
releases the GIL and spreads them over the cores; the loop only queues texts and hands back ids. A batch
too small to pay for the thread hop (a lone short chat turn) is encoded inline, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from runtime.errors import EngineNotReadyError
from runtime.tokenizer import Tokenizer

# Characters of a batch under which it is encoded on the loop: about 20 us of encoding, the cost of the
# hop to a thread and back.
INLINE_CHARS = 512

_Entry = tuple[str, bool, "asyncio.Future[list[int]]"]


class BatchEncoder:
    """Token ids of prompts, encoded in batches in one worker thread."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="encode")
        self._queued: list[_Entry] = []

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids of `text`, as Tokenizer.encode gives them."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[int]] = loop.create_future()
        self._queued.append((text, add_special_tokens, future))
        if len(self._queued) == 1:  # after the other requests that this pass of the loop runs
            loop.call_soon(self._flush, loop)
        return await future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        batch, self._queued = self._queued, []
        if sum(len(text) for text, _, _ in batch) <= INLINE_CHARS:
            _deliver(batch, self._encode(batch))
            return
        job = loop.run_in_executor(self._executor, self._encode, batch)
        job.add_done_callback(lambda done: _deliver(batch, _results(done, len(batch))))

    def _encode(self, batch: Sequence[_Entry]) -> list[list[int] | BaseException]:
        """Each entry's ids, or its error: a text the tokenizer refuses fails only its own request."""
        results: list[list[int] | BaseException] = [[] for _ in batch]
        for special in (True, False):
            where = [i for i, (_, add, _) in enumerate(batch) if add is special]
            if not where:
                continue
            try:
                encoded: Sequence[list[int] | BaseException] = self._tokenizer.encode_many(
                    [batch[i][0] for i in where], add_special_tokens=special)
            except Exception:  # find the culprit: one by one
                encoded = [self._encode_one(batch[i][0], special) for i in where]
            for i, ids in zip(where, encoded):
                results[i] = ids
        return results

    def _encode_one(self, text: str, add_special_tokens: bool) -> list[int] | BaseException:
        try:
            return self._tokenizer.encode(text, add_special_tokens=add_special_tokens)
        except Exception as exc:
            return exc

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _results(job: asyncio.Future[list[list[int] | BaseException]], n: int) -> list[list[int] | BaseException]:
    if job.cancelled():  # shut down with the batch still queued
        return [EngineNotReadyError("The engine is shutting down")] * n
    return job.result()


def _deliver(batch: Sequence[_Entry], results: Sequence[list[int] | BaseException]) -> None:
    for (_, _, future), result in zip(batch, results):
        if future.done():  # its request was cancelled (the client left)
            continue
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)


__all__ = ["INLINE_CHARS", "BatchEncoder"]
