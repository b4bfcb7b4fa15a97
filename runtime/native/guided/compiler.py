"""GuidedCompiler: compiles GuidedDecoding constraints against one tokenizer, cached by constraint.

Compiling a JSON schema costs milliseconds to seconds (it walks the vocabulary); a server sees the same
few schemas over and over (one per tool set or response model), so compiled grammars are kept in a
GrammarCache (runtime/native/guided/cache.py) keyed by the constraint's canonical JSON, within a byte budget.

A compile cannot be interrupted, so what may be compiled is bounded up front (runtime/guided_limits.py)
and compiles run in this compiler's own few threads (xgrammar releases the GIL while it compiles): a
burst of new or slow constraints waits for those threads, or is refused when too many wait, while every
other request, guided ones with a cached grammar included, goes on. Concurrent requests for the same new
constraint share one compile.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

import xgrammar as xgr

from runtime.errors import InvalidRequestError, QueueFullError
from runtime.native.guided.cache import GrammarCache
from runtime.native.guided.grammars import build_grammar
from runtime.native.guided.guide import GuideState
from runtime.guided_limits import MAX_COMPILE_SECONDS, check_limits
from runtime.request import GuidedDecoding


def constraint_key(guided: GuidedDecoding) -> str:
    """Canonical JSON of the constraint: equal constraints share one compiled grammar."""
    fields = asdict(guided)
    del fields["param"]  # where it came from does not change the grammar
    return json.dumps(fields, sort_keys=True, separators=(",", ":"))


class GuidedCompiler:
    """Compiled grammars for one tokenizer and vocabulary (thread-safe).

    cache_bytes: the compiled grammars kept (measured: a 10k-value enum compiles to 25 MiB, a typical
    response model to under 0.1 MiB); threads: compiles at once; max_queued: compiles running or waiting,
    past which a request for a new constraint is refused with QueueFullError.
    """

    def __init__(self, hf_tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int],
                 cache_bytes: int = 256 * 2**20, threads: int = 2, max_queued: int = 16) -> None:
        self.stop_token_ids = list(stop_token_ids)
        self._tokenizer, self._vocab_size = hf_tokenizer, vocab_size
        self._compiler: xgr.GrammarCompiler | None = None  # made in a compile thread: it walks the vocabulary
        self.cache = GrammarCache(cache_bytes)
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="guided-compile")
        self._pending: dict[str, Future[xgr.CompiledGrammar]] = {}
        self._max_queued = max_queued
        self._lock = threading.Lock()  # the event loop takes it: never held for long
        self._compiler_lock = threading.Lock()
        self.hits = self.misses = 0

    def compile(self, guided: GuidedDecoding) -> xgr.CompiledGrammar:
        """The compiled grammar, waiting for it here (blocking); InvalidRequestError for unsupported,
        malformed, oversized or too slow constraints."""
        key, compiled = self._lookup(guided)
        if compiled is not None:
            return compiled
        try:
            return self._submit(key, guided).result()
        except InvalidRequestError as exc:
            raise _with_param(exc, guided) from None

    async def guide_factory_async(self, guided: GuidedDecoding) -> Callable[[], GuideState]:
        """Compile `guided` (errors surface at submission) and return a maker of fresh matchers.

        The limits check and cache lookup (bounded work, but a constraint may be megabytes) run in the
        default executor, the compile in this compiler's threads.
        """
        key, compiled = await asyncio.to_thread(self._lookup, guided)
        if compiled is None:
            try:  # shielded: one waiter leaving must not cancel a compile that others share
                compiled = await asyncio.shield(asyncio.wrap_future(self._submit(key, guided)))
            except InvalidRequestError as exc:
                raise _with_param(exc, guided) from None
        grammar = compiled
        return lambda: self.new_guide(grammar)

    def guide_factory(self, guided: GuidedDecoding) -> Callable[[], GuideState]:
        """guide_factory_async's blocking twin (for callers already in a worker thread)."""
        compiled = self.compile(guided)
        return lambda: self.new_guide(compiled)

    def new_guide(self, compiled: xgr.CompiledGrammar) -> GuideState:
        """A fresh matcher at the start of the grammar (one per sample)."""
        return GuideState(compiled, self.stop_token_ids)

    def _lookup(self, guided: GuidedDecoding) -> tuple[str, xgr.CompiledGrammar | None]:
        """(the constraint's key, its cached grammar or None); raises for constraints past the limits
        and for ones refused before."""
        check_limits(guided)
        key = constraint_key(guided)
        entry = self.cache.get(key)
        if isinstance(entry, str):
            raise InvalidRequestError(entry, param=guided.param)
        if entry is not None:
            with self._lock:
                self.hits += 1
        return key, entry

    def _submit(self, key: str, guided: GuidedDecoding) -> Future[xgr.CompiledGrammar]:
        """The compile of `key`: the one under way, else a new one (QueueFullError past max_queued)."""
        with self._lock:
            future = self._pending.get(key)
            if future is not None:
                return future
            if len(self._pending) >= self._max_queued:
                raise QueueFullError(f"{len(self._pending)} guided decoding grammars are compiling or waiting to; "
                                     "retry later")
            future = self._executor.submit(self._build, key, guided)
            self._pending[key] = future
            return future

    def _build(self, key: str, guided: GuidedDecoding) -> xgr.CompiledGrammar:
        """Build and compile `guided` in a compile thread; cache the grammar, or the refusal when slow."""
        try:
            entry = self.cache.get(key)  # a compile that ended after the lookup may have cached it
            if isinstance(entry, str):
                raise InvalidRequestError(entry, param=guided.param)
            if entry is not None:
                return entry
            compiler = self._xgrammar()
            # CPU time of this thread (xgrammar compiles in the calling thread with max_threads=1): a busy
            # machine must not get a usual constraint refused for good.
            start = time.thread_time()
            compiled = compiler.compile_grammar(build_grammar(guided))
            seconds = time.thread_time() - start
            if seconds > MAX_COMPILE_SECONDS:
                refusal = (f"The guided decoding constraint took {seconds:.1f} s of CPU to compile, more than the "
                           f"{MAX_COMPILE_SECONDS:g} s allowed; simplify it.")
                self.cache.put(key, refusal)
                raise InvalidRequestError(refusal, param=guided.param)
            self.cache.put(key, compiled)
            with self._lock:
                self.misses += 1  # grammars compiled
            return compiled
        finally:
            with self._lock:
                del self._pending[key]

    def _xgrammar(self) -> xgr.GrammarCompiler:
        with self._compiler_lock:
            if self._compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(self._tokenizer, vocab_size=self._vocab_size,
                                                          stop_token_ids=self.stop_token_ids)
                self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            return self._compiler


def _with_param(exc: InvalidRequestError, guided: GuidedDecoding) -> InvalidRequestError:
    """`exc` naming this request's field: a compile shared by requests raised it with the first one's."""
    return InvalidRequestError(exc.message, param=guided.param)
