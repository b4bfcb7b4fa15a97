"""Start-up phases: what an engine is doing while it starts, or builds faster code in the background while it
serves (GET /health shows it), each phase logged in one line with its seconds:

    start-up: loading the weights: 1.2 s
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

logger = logging.getLogger("runtime.startup")


class StartupPhases:
    """The phase under way (None: none), set by `phase()` blocks, which may run in any thread."""

    def __init__(self) -> None:
        self.current: str | None = None

    @contextlib.contextmanager
    def phase(self, what: str) -> Iterator[None]:
        previous, self.current = self.current, what
        started = time.perf_counter()
        try:
            yield
        finally:
            self.current = previous
            logger.info("start-up: %s: %.1f s", what, time.perf_counter() - started)
