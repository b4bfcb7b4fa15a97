"""A child process (the engine core, front ends other than the first) exits when the process that started it dies,
so that nothing is left behind when a parent is killed without a chance to stop its children."""

from __future__ import annotations

import logging
import os
import threading
import time

logger = logging.getLogger(__name__)

PARENT_POLL = 0.5  # s between checks that the parent is still alive


def exit_when_orphaned(parent_pid: int) -> None:
    """Exit (1) within PARENT_POLL s of the parent process's death."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL)
        logger.error("the parent process is gone; process %d exits", os.getpid())
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
