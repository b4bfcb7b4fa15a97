"""The Responses API's store: stored responses, kept in memory, bounded in number, bytes and age, each readable
only by the API key that created it.

    ResponseStore(max_size, ttl, max_bytes, clock=time.monotonic)
    mine = store.owned_by(owner)       # owner: gateway.auth.AuthPolicy.identity of the caller's key

What is kept per response (`store: true`, OpenAI's default): the response object as POST returned it
(what GET /v1/responses/{id} answers; it holds the instructions and the output items) and the
conversation a later `previous_response_id` continues: the input items (those of the responses it
continued included) followed by its output items. At most `max_size` responses are kept and at most
`max_bytes` of them (their JSON, about what they hold in memory; 200 responses of 5 MB each took 1.1 GB when
only their number was bounded), the oldest dropped first (0: none), each for `ttl` seconds (None: until
dropped for room). A response belongs to the key that created it (every caller without a configured key is one
anonymous owner): another key's GET, DELETE, input items and `previous_response_id` find nothing (404), as if
it did not exist. Nothing is written to disk; a restart forgets everything. Safe to use from worker threads
(requests are prepared there).
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StoredResponse:
    """One stored response: its object (GET's answer) and the conversation through its output."""

    response: dict[str, Any]
    items: list[Any]  # adapters.openai.responses_request.InputItem
    owner: bytes = b""  # the identity of the key that created it
    size: int = field(default=0, compare=False)  # bytes counted against the store's bound (set by `put`)


def entry_bytes(entry: StoredResponse) -> int:
    """About the bytes `entry` holds: the length of its JSON."""
    items = sum(len(item.model_dump_json()) if hasattr(item, "model_dump_json") else len(json.dumps(item))
                for item in entry.items)
    return len(json.dumps(entry.response, default=str)) + items


class ResponseStore:
    """Stored responses by id, oldest first; `clock` (seconds, monotonic) is injectable for tests."""

    def __init__(self, max_size: int, ttl: float | None, max_bytes: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_size < 0:
            raise ValueError(f"--responses-store-size must be 0 or more, got {max_size}")
        if ttl is not None and ttl <= 0:
            raise ValueError(f"--responses-store-ttl must be positive (or none), got {ttl}")
        if max_bytes < 0:
            raise ValueError(f"--responses-store-bytes must be 0 or more, got {max_bytes}")
        self.max_size = max_size
        self.ttl = ttl
        self.max_bytes = max_bytes
        self.bytes = 0  # what the kept entries count
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, StoredResponse]] = OrderedDict()  # id -> (expiry, entry)
        self._lock = threading.Lock()

    def owned_by(self, owner: bytes) -> OwnedResponses:
        """The store as `owner` sees it: only its own responses."""
        return OwnedResponses(self, owner)

    def put(self, response_id: str, entry: StoredResponse) -> None:
        """Keep `entry` (newest), dropping expired entries and then the oldest beyond the bounds (one larger
        than `max_bytes` by itself is not kept)."""
        if self.max_size == 0:
            return
        size = entry_bytes(entry)
        if size > self.max_bytes:
            return
        entry = StoredResponse(entry.response, entry.items, entry.owner, size)
        now = self._clock()
        with self._lock:
            self._expire(now)
            self._drop(response_id)
            self._entries[response_id] = (now + self.ttl if self.ttl is not None else float("inf"), entry)
            self.bytes += size
            while len(self._entries) > self.max_size or self.bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def get(self, response_id: str, owner: bytes) -> StoredResponse | None:
        """The entry, or None when it was never stored, was deleted, dropped, has expired or is another's."""
        with self._lock:
            self._expire(self._clock())
            found = self._entries.get(response_id)
        return None if found is None or found[1].owner != owner else found[1]

    def delete(self, response_id: str, owner: bytes) -> bool:
        """Forget the entry; False when there was none for `owner` (or it had expired)."""
        with self._lock:
            self._expire(self._clock())
            found = self._entries.get(response_id)
            if found is None or found[1].owner != owner:
                return False
            self._drop(response_id)
            return True

    def __len__(self) -> int:
        with self._lock:
            self._expire(self._clock())
            return len(self._entries)

    def _drop(self, response_id: str) -> None:
        found = self._entries.pop(response_id, None)
        if found is not None:
            self.bytes -= found[1].size

    def _expire(self, now: float) -> None:
        # Entries are in insertion order and share one ttl, so expiries are ordered too: drop from the front.
        while self._entries:
            response_id, (expiry, _) = next(iter(self._entries.items()))
            if expiry > now:
                break
            self._drop(response_id)


@dataclass(frozen=True)
class OwnedResponses:
    """One owner's view of a ResponseStore (what the routes use, so that no route can read another's)."""

    store: ResponseStore
    owner: bytes

    def put(self, response_id: str, response: dict[str, Any], items: list[Any]) -> None:
        self.store.put(response_id, StoredResponse(response, items, self.owner))

    def get(self, response_id: str) -> StoredResponse | None:
        return self.store.get(response_id, self.owner)

    def delete(self, response_id: str) -> bool:
        return self.store.delete(response_id, self.owner)
