"""A child process (the engine core, tensor-parallel workers, front ends other than the first) exits when the process
that started it dies, so that nothing is left behind when a parent is killed without a chance to stop its children."""

from __future__ import annotations

import ctypes
import logging
import os
import select
import signal
import sys
import threading
import time

logger = logging.getLogger(__name__)

PARENT_POLL = 0.5  # s between checks that the parent is still alive


PR_SET_PDEATHSIG = 1  # prctl(2) option: the signal the kernel sends when the parent dies


def exit_when_orphaned(parent_pid: int) -> None:
    """Die with the process that launched this one (the engine core with the first front end, a tensor-parallel
    worker with rank 0's process): it would otherwise step on for streams no one reads, holding the GPU. Its OS parent
    is the zygote (runtime/process/launcher.py), so it watches the launching process itself: on Linux through a
    pidfd, readable the moment that process exits; elsewhere by a look every PARENT_POLL s. The kernel also kills it
    when the zygote dies (Linux). (Other front ends drain instead: gateway/api_servers.py.)"""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    def watch() -> None:
        try:
            select.select([os.pidfd_open(parent_pid)], [], [])
        except ProcessLookupError:  # gone already
            pass
        except (AttributeError, OSError):  # no pidfds here
            while _alive(parent_pid):
                time.sleep(PARENT_POLL)
        logger.error("the process that started this one is gone; process %d exits", os.getpid())
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # (PermissionError: another user's process has its number now)
        return False
    return True
