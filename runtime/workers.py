"""WorkerPool: a small, bounded thread pool for per-request preparation that may be slow.

    pool = WorkerPool("prepare", threads=2)
    ids = await pool.call(len(text) > HEAVY_CHARS, tokenizer.encode, text)

Tokenizing a large prompt, rendering a long chat or encoding thousands of bad words can take seconds;
on the event loop that froze every other request (an 8 MB prompt held /health for 5.6 s, measured
2026-11-24). Heavy work goes to the pool's threads, where tokenizers' batch encoding releases the GIL
and pure-Python work (chat templates) yields it every switch interval. Light work runs inline: a thread
hop costs more than encoding a short prompt, and most requests are short.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from runtime.request import GenerationRequest

P = ParamSpec("P")
T = TypeVar("T")

# Characters of text (prompt, chat content, words) above which preparing a request leaves the loop:
# encoding 8 KiB takes about 0.5 ms on one core, the most a request may hold the loop for.
HEAVY_CHARS = 8192


def is_heavy(request: GenerationRequest) -> bool:
    """Whether preparing `request` (tokenizing its prompt and bad words) may hold a thread for long."""
    words = request.sampling.bad_words
    return len(request.prompt or "") + sum(map(len, words)) > HEAVY_CHARS or len(words) > 64


class WorkerPool:
    """`threads` named worker threads; `call` awaits a function there (or runs it inline when light)."""

    def __init__(self, name: str, threads: int = 2) -> None:
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)

    async def call(self, heavy: bool, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)`: in a worker thread when `heavy`, else right here."""
        if not heavy:
            return fn(*args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def shutdown(self) -> None:
        """Stop the threads once queued work ends (nothing new may be submitted)."""
        self._executor.shutdown(wait=False, cancel_futures=True)


__all__ = ["HEAVY_CHARS", "WorkerPool", "is_heavy"]
