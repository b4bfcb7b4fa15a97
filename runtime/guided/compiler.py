"""GuidedCompiler: compiles GuidedDecoding constraints against one tokenizer, cached by constraint.

Compiling a JSON schema costs milliseconds to seconds (it walks the vocabulary); a server sees the same
few schemas over and over (one per tool set or response model), so compiled grammars are kept in an
LRU cache keyed by the constraint's canonical JSON.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import xgrammar as xgr

from runtime.guided.grammars import build_grammar
from runtime.guided.guide import GuideState
from runtime.request import GuidedDecoding


def constraint_key(guided: GuidedDecoding) -> str:
    """Canonical JSON of the constraint: equal constraints share one compiled grammar."""
    fields = asdict(guided)
    del fields["param"]  # where it came from does not change the grammar
    return json.dumps(fields, sort_keys=True, separators=(",", ":"))


class GuidedCompiler:
    """Compiled grammars for one tokenizer and vocabulary (thread-safe)."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int],
                 max_entries: int = 256) -> None:
        self.stop_token_ids = list(stop_token_ids)
        info = xgr.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=self.stop_token_ids)
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._cache: OrderedDict[str, xgr.CompiledGrammar] = OrderedDict()
        self._max_entries = max_entries
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def compile(self, guided: GuidedDecoding) -> xgr.CompiledGrammar:
        """The compiled grammar (cached); InvalidRequestError for unsupported or malformed constraints."""
        key = constraint_key(guided)
        with self._lock:
            compiled = self._cache.get(key)
            if compiled is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return compiled
        compiled = self._compiler.compile_grammar(build_grammar(guided))  # outside the lock: slow
        with self._lock:
            self.misses += 1
            self._cache[key] = compiled
            while len(self._cache) > self._max_entries:
                self._cache.popitem(last=False)
        return compiled

    def new_guide(self, compiled: xgr.CompiledGrammar) -> GuideState:
        """A fresh matcher at the start of the grammar (one per sample)."""
        return GuideState(compiled, self.stop_token_ids)

    def guide_factory(self, guided: GuidedDecoding) -> Callable[[], GuideState]:
        """Compile `guided` now (errors surface at submission) and return a maker of fresh matchers."""
        compiled = self.compile(guided)
        return lambda: self.new_guide(compiled)
