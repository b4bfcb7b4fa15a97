"""Starts our child processes (the engine core, tensor-parallel workers) by forking them from a zygote that has
imported torch and the engine once (runtime/native/zygote.py), not each from a fresh interpreter: a start costs a
fork instead of ~2 s of CPU importing torch and the model code (a tensor-parallel engine's workers, a core restarted
in the same process, the test suite's ~40 engines). The zygote is itself a fresh interpreter, started at this
process's first launch, so a child inherits none of this process's threads, sockets or CUDA state, and it shares
the zygote's imported pages.

A child gets what `python -m` of its module would: this process's current environment (our packages on PYTHONPATH),
working directory, stdout and stderr (fds 1 and 2 as they are at the launch, redirections included), default signal
handling, and a normal interpreter exit. One difference: what torch and the engine's modules read from the
environment when they are imported (OMP_NUM_THREADS by the OpenMP runtime, TRITON_INTERPRET) keeps the value it had
when the zygote started. Each child names itself (`engine-core`, `tp-worker-1`: the name `ps -e`, `top`, `pgrep`
and psutil show; `ps aux` shows the zygote's command line). Its OS parent is the zygote, so it watches the launching
process itself (runtime/process/parent.py).
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import threading

from runtime.served_model import with_our_packages

ZYGOTE_EXIT = 5.0  # s the zygote may take to exit once this process closes its socket (at exit)


@dataclasses.dataclass(frozen=True)
class Launch:
    """A request to the zygote: `entry(args)` ("module:function") in a process named `name`, with this environment and
    working folder (stdout and stderr travel beside it)."""

    name: str
    entry: str
    args: bytes
    env: dict[str, str]
    cwd: str


class Child:
    """A launched process, with the part of subprocess.Popen's interface its users need."""

    def __init__(self, zygote: _Zygote, pid: int) -> None:
        self._zygote = zygote
        self.pid = pid

    @property
    def returncode(self) -> int | None:
        """The exit code once it has exited (minus the signal that killed it), else None."""
        return self._zygote.exit_code(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code; subprocess.TimeoutExpired if it is still running after `timeout` s."""
        code = self._zygote.wait(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        return code

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:  # exited; the zygote's word of it is on its way
                pass


class _Zygote:
    """The zygote process and its socket: launches, and the exit codes it reports."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process = subprocess.Popen([sys.executable, "-m", "runtime.native.zygote", str(theirs.fileno())],
                                        pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                        env=with_our_packages(os.environ))
        theirs.close()
        self._socket = ours
        self._lock = threading.Lock()  # one launch at a time
        self._started: queue.Queue[int | None] = queue.Queue()
        self._codes: dict[int, int] = {}
        self._changed = threading.Condition()
        self.alive = True
        threading.Thread(target=self._read, name="zygote-reader", daemon=True).start()
        atexit.register(self.close)

    def launch(self, launch: Launch) -> Child:
        with self._lock:
            socket.send_fds(self._socket, [pickle.dumps(launch)], [1, 2])
            pid = self._started.get()
        if pid is None:
            raise RuntimeError(f"the zygote process {self.process.pid} exited (its log says why)")
        return Child(self, pid)

    def exit_code(self, pid: int) -> int | None:
        with self._changed:
            return self._code(pid)

    def wait(self, pid: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: self._code(pid) is not None, timeout)
            return self._code(pid)

    def _code(self, pid: int) -> int | None:
        # a zygote that died took its children with it (runtime/process/parent.py: they die by SIGKILL)
        return self._codes.get(pid, None if self.alive else -signal.SIGKILL)

    def _read(self) -> None:
        while data := self._socket.recv(4096):
            message = pickle.loads(data)
            if message[0] == "started":
                self._started.put(message[1])
            else:
                with self._changed:
                    self._codes[message[1]] = message[2]
                    self._changed.notify_all()
        self.process.wait()
        with self._changed:
            self.alive = False
            self._changed.notify_all()
        self._started.put(None)

    def close(self) -> None:
        """Let it exit (it does when this end of its socket closes). shutdown() first: a plain close() leaves the
        socket open while the reader thread's recv holds it, and the zygote waits for an end that does not come."""
        try:
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:  # (closed already: the zygote went first)
            pass
        self._socket.close()
        try:
            self.process.wait(ZYGOTE_EXIT)
        except subprocess.TimeoutExpired:
            self.process.kill()


_zygote: _Zygote | None = None
_zygote_lock = threading.Lock()


def launch(name: str, entry: str, args: bytes) -> Child:
    """Run `entry(args)` in a new process named `name`; its return value is the exit code. `entry` names a function
    as "module:function" (so that the launcher need not import it: a front end imports no torch)."""
    global _zygote
    with _zygote_lock:
        if _zygote is None or not _zygote.alive:
            _zygote = _Zygote()
        zygote = _zygote
    return zygote.launch(Launch(name, entry, args, with_our_packages(os.environ), os.getcwd()))
