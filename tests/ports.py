"""Loopback ports for the servers tests start, distinct across pytest-xdist workers.

    port = free_port()

Each worker hands out ports from its own slice of 20000-32767, which lies below Linux's ephemeral range (a
socket bound to port 0, a client's connection, never lands there), in turn from a random start, skipping any
port something is bound to. So two workers of one run never get the same port, and neither does a server
waiting to bind the port it was given while the other worker asks for one. Another run on the machine (a second
checkout) takes its own random start in the same slice: the bind check skips what it already holds.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from collections.abc import Iterator

FIRST, END = 20000, 32768


def _worker_slice() -> range:
    """This process's ports: slice i of n for xdist worker gw<i> of n; all of them outside xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(worker[2:]) if worker.startswith("gw") else 0
    size = (END - FIRST) // max(count, 1)
    return range(FIRST + index * size, FIRST + (index + 1) * size)


def _candidates() -> Iterator[int]:
    ports = _worker_slice()
    start = random.randrange(len(ports))
    return itertools.cycle([*ports[start:], *ports[:start]])


_NEXT: Iterator[int] | None = None


def free_port() -> int:
    """A loopback TCP port nothing is bound to, not handed out before by this process."""
    global _NEXT
    if _NEXT is None:
        _NEXT = _candidates()
    for port in itertools.islice(_NEXT, END - FIRST):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {_worker_slice()}")
