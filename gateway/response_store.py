"""The Responses API's store: stored responses, kept in memory, bounded in number and age.

    ResponseStore(max_size, ttl, clock=time.monotonic)

What is kept per response (`store: true`, OpenAI's default): the response object as POST returned it
(what GET /v1/responses/{id} answers; it holds the instructions and the output items) and the
conversation a later `previous_response_id` continues: the input items (those of the responses it
continued included) followed by its output items. At most `max_size` responses are kept, the oldest
dropped first (0: none), each for `ttl` seconds (None: until dropped for size). Nothing is written to
disk; a restart forgets everything. Safe to use from worker threads (requests are prepared there).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StoredResponse:
    """One stored response: its object (GET's answer) and the conversation through its output."""

    response: dict[str, Any]
    items: list[Any]  # adapters.openai.responses_request.InputItem


class ResponseStore:
    """Stored responses by id, oldest first; `clock` (seconds, monotonic) is injectable for tests."""

    def __init__(self, max_size: int, ttl: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        if max_size < 0:
            raise ValueError(f"--responses-store-size must be 0 or more, got {max_size}")
        if ttl is not None and ttl <= 0:
            raise ValueError(f"--responses-store-ttl must be positive (or none), got {ttl}")
        self.max_size = max_size
        self.ttl = ttl
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, StoredResponse]] = OrderedDict()  # id -> (expiry, entry)
        self._lock = threading.Lock()

    def put(self, response_id: str, entry: StoredResponse) -> None:
        """Keep `entry` (newest), dropping expired entries and then the oldest beyond max_size."""
        if self.max_size == 0:
            return
        now = self._clock()
        with self._lock:
            self._expire(now)
            self._entries.pop(response_id, None)
            self._entries[response_id] = (now + self.ttl if self.ttl is not None else float("inf"), entry)
            while len(self._entries) > self.max_size:
                self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        """The entry, or None when it was never stored, was deleted, dropped or has expired."""
        with self._lock:
            self._expire(self._clock())
            found = self._entries.get(response_id)
        return None if found is None else found[1]

    def delete(self, response_id: str) -> bool:
        """Forget the entry; False when there was none (or it had expired)."""
        with self._lock:
            self._expire(self._clock())
            return self._entries.pop(response_id, None) is not None

    def __len__(self) -> int:
        with self._lock:
            self._expire(self._clock())
            return len(self._entries)

    def _expire(self, now: float) -> None:
        # Entries are in insertion order and share one ttl, so expiries are ordered too: drop from the front.
        while self._entries:
            expiry, _ = next(iter(self._entries.values()))
            if expiry > now:
                break
            self._entries.popitem(last=False)
