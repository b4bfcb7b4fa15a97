"""GrammarCache: compiled grammars by constraint key, least recently used out first, bounded by bytes.

A bound by count (256 grammars) let one json_schema enum of 100k values keep 252 MB, five of them took the
server from 1.4 to 2.7 GB, and it stayed held while idle. Here each entry costs its compiled grammar's
`memory_size_bytes` plus its key, and a grammar larger than the whole budget is not kept. A refusal (a
constraint that took too long to compile) is kept as its message, so that it is refused at once next time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import xgrammar as xgr

Entry = xgr.CompiledGrammar | str  # a grammar, or why its constraint is refused


class GrammarCache:
    """LRU of compiled grammars (and refusals) within `max_bytes` (thread-safe)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: OrderedDict[str, tuple[Entry, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> Entry | None:
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            self._entries.move_to_end(key)
            return found[0]

    def put(self, key: str, entry: Entry) -> None:
        """Keep `entry`, dropping the least recently used ones past the budget (not at all if it alone is)."""
        size = len(key) + (len(entry) if isinstance(entry, str) else entry.memory_size_bytes)
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.nbytes -= old[1]
            self._entries[key] = (entry, size)
            self.nbytes += size
            while self.nbytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self.nbytes -= dropped
