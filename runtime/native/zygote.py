"""The process our child processes fork from (runtime/process/launcher.py starts one per launching process, at its
first launch): a fresh interpreter that imports the engine core's and the tensor-parallel worker's modules (torch and
the model code with them) and transformers' tokenizers once, then forks a child for each request on its socket.
Importing them starts no thread that matters to a fork and touches no GPU.

    python -m runtime.native.zygote FD    # FD: its end of the launcher's socket pair; started by the launcher

A request is a pickled Launch (runtime/process/launcher.py) with the launcher's stdout and stderr attached
(SCM_RIGHTS); the answer is ("started", pid), and ("exited", pid, code) when that child exits (code as subprocess's
returncode: minus the signal). The forked child returns out of `main` with its entry's exit code, so it ends as a
`python -m` process would: atexit handlers, non-daemon threads joined, streams flushed.

It ignores SIGINT and SIGTERM: a signal sent to the whole process group reaches it too, and it must outlive the
engine core, which keeps serving while its front end drains (its children die with it: runtime/process/parent.py).
It exits when the launcher's end of the socket closes.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import pickle
import selectors
import signal
import socket
import sys

from transformers import PreTrainedTokenizerFast  # noqa: F401  (every core loads its tokenizer: ~0.5 s of imports)

import runtime.native.core_process  # noqa: F401  (imported once, here, for every child)
import runtime.native.parallel.worker  # noqa: F401
from runtime.process.launcher import Launch

MAX_REQUEST = 1 << 20  # bytes of one pickled Launch
PR_SET_NAME = 15  # prctl(2) option: the thread's name (the process's, for its main thread), 15 bytes at most


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    launcher = socket.socket(fileno=int(sys.argv[1]))
    selector = selectors.DefaultSelector()
    selector.register(launcher, selectors.EVENT_READ)
    children: dict[int, int] = {}  # pidfd -> pid
    while True:
        for key, _ in selector.select():
            if key.fileobj is launcher:
                data, fds, _, _ = socket.recv_fds(launcher, MAX_REQUEST, 2)
                if not data:  # the launcher is gone
                    return 0
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    launcher.close()
                    for sibling in children:
                        os.close(sibling)
                    return _child(pickle.loads(data), *fds)
                for fd in fds:
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                children[pidfd] = pid
                selector.register(pidfd, selectors.EVENT_READ)
                launcher.send(pickle.dumps(("started", pid)))
            else:
                pidfd = key.fd
                selector.unregister(pidfd)
                os.close(pidfd)
                pid = children.pop(pidfd)
                _, status = os.waitpid(pid, 0)
                launcher.send(pickle.dumps(("exited", pid, os.waitstatus_to_exitcode(status))))


def _child(launch: Launch, stdout: int, stderr: int) -> int:
    """In the fork: the launcher's output, environment, folder and signal handling, then the entry."""
    for fd, target in ((stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(launch.env)
    os.chdir(launch.cwd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(PR_SET_NAME, launch.name.encode()[:15])
    module, _, function = launch.entry.partition(":")
    return getattr(importlib.import_module(module), function)(launch.args)


if __name__ == "__main__":
    sys.exit(main())
