"""Which engine core a request goes to under --data-parallel-size N (runtime/process/data_parallel.py).

Each request goes to the live core with the fewest queued tokens: the prompt tokens plus the most tokens to
generate of the requests it holds, counted here when they are sent and given back when they end. A request whose
prompt starts with a prefix that an earlier request sent to some core prefers that core, whose prefix cache may
still hold the prefix's KV blocks, unless that core is queued more than AFFINITY_SLACK tokens past the least queued.
Prefixes are remembered per whole KV block (block-aligned, up to MAX_PREFIX_BLOCKS blocks) in a table bounded to
TABLE_SIZE entries, the least recently used forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

AFFINITY_SLACK = 4096  # queued tokens a prefix's core may be behind the least queued one and still get it
MAX_PREFIX_BLOCKS = 16  # the longest prefix remembered, in KV blocks
TABLE_SIZE = 65536  # prefix entries kept (a few MB)


class Router:
    """Picks a core per request; told when each request ends."""

    def __init__(self, cores: int, block_size: int) -> None:
        self.queued = [0] * cores  # tokens each core has been sent and not finished
        self.alive = [True] * cores
        self._block_size = block_size
        self._prefixes: OrderedDict[int, int] = OrderedDict()  # prefix hash -> the core that last served it
        self._held: dict[str, tuple[int, int]] = {}  # request id -> (core, tokens counted)

    def pick(self, request_id: str, prompt: Sequence[int], max_tokens: int) -> int:
        """The core for a new request (counted there until `finish`); ValueError when no core is alive."""
        live = [core for core, alive in enumerate(self.alive) if alive]
        if not live:
            raise ValueError("no engine core is serving")
        least = min(live, key=lambda core: self.queued[core])
        hashes = self._prefix_hashes(prompt)
        chosen = least
        for prefix in reversed(hashes):  # the longest prefix seen before
            core = self._prefixes.get(prefix)
            if core is not None:
                if self.alive[core] and self.queued[core] - self.queued[least] <= AFFINITY_SLACK:
                    chosen = core
                break
        for prefix in hashes:
            self._prefixes[prefix] = chosen
            self._prefixes.move_to_end(prefix)
        while len(self._prefixes) > TABLE_SIZE:
            self._prefixes.popitem(last=False)
        cost = len(prompt) + max_tokens
        self.queued[chosen] += cost
        self._held[request_id] = (chosen, cost)
        return chosen

    def finish(self, request_id: str) -> None:
        """The request ended (finished, failed or aborted): its tokens leave its core's count."""
        held = self._held.pop(request_id, None)
        if held is not None:
            self.queued[held[0]] -= held[1]

    def lose(self, core: int) -> None:
        """The core stopped serving: no request goes there again."""
        self.alive[core] = False

    def _prefix_hashes(self, prompt: Sequence[int]) -> list[int]:
        """Hashes of the prompt's block-aligned prefixes, shortest first (each one's hash chains its blocks)."""
        hashes: list[int] = []
        running = 0
        blocks = min(len(prompt) // self._block_size, MAX_PREFIX_BLOCKS)
        for block in range(blocks):
            running = hash((running, tuple(prompt[block * self._block_size:(block + 1) * self._block_size])))
            hashes.append(running)
        return hashes
