"""A child process (the engine core, front ends other than the first) exits when the process that started it dies,
so that nothing is left behind when a parent is killed without a chance to stop its children."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time

logger = logging.getLogger(__name__)

PARENT_POLL = 0.5  # s between checks that the parent is still alive


PR_SET_PDEATHSIG = 1  # prctl(2) option: the signal the kernel sends when the parent dies


def exit_when_orphaned(parent_pid: int) -> None:
    """Die with the parent process (the engine core with the first front end): on Linux the kernel kills this
    process the moment its parent dies (it would otherwise step on for streams no one reads, holding the GPU); a
    poll every PARENT_POLL s covers other systems and a parent that died before the request was made. (Other front
    ends drain instead: gateway/api_servers.py.)"""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL)
        logger.error("the parent process is gone; process %d exits", os.getpid())
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
