"""--api-servers N: N HTTP front-end processes on one port, sharing one engine core, so that HTTP work
(parsing, tokenizing, detokenizing, SSE) scales past one CPU core.

    python -m gateway serve --api-servers 4        # gateway.cli.serve calls serve_many()

The first process binds the listening socket and runs front end 0, which starts the engine core with one
ZeroMQ socket pair per front end (runtime/process/client.py). It starts front ends 1..N-1 as fresh
interpreters (`python -m gateway.api_servers`) that inherit the socket (the kernel hands each connection
to one of them) and receive the settings on stdin. Each serves the whole API; gRPC binds its port in each
with SO_REUSEPORT. /metrics answers for the process that takes the scrape.

Lifecycle: SIGTERM or Ctrl-C reaches the first process, which forwards SIGTERM to the others; all drain,
and the first shuts the core down only after the others have exited. Front ends other than the first
ignore SIGINT (a terminal's Ctrl-C reaches the whole group; the forwarded SIGTERM is theirs). A front end
other than the first that dies is restarted by the first (the others serve on; its streams are lost with
its process, and what it left running in the core is aborted when the new one attaches), after a pause
that doubles while it keeps dying within RESTART_WINDOW s; `trtllm_gateway_front_end_restarts_total` counts
the restarts (every front end reports it). When the first is gone, the others drain as on SIGTERM, their
streams ending with an error event when the core goes with it, and exit non-zero; the core dying makes every
front end exit non-zero.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.metrics import PREFIX
from gateway.settings import Settings
from runtime.process.client import EngineClient, FrontEnd
from runtime.process.parent import PARENT_POLL

log = logging.getLogger("gateway.api_servers")

RESTART_WINDOW = 10.0  # s: a front end that dies sooner after its start waits longer before the next one
MAX_RESTART_PAUSE = 30.0  # s
FIRST_SERVES_POLL = 0.05  # s between looks for front end 0's readiness (while this one's engine is ready)

class _Child(msgspec.Struct):
    """What front end `index` gets on its stdin."""

    settings: Settings
    index: int
    count: int
    folder: str
    fd: int  # the inherited listening socket
    parent_pid: int


def listening_socket(host: str, port: int) -> socket.socket:
    """The one TCP socket every front end accepts on."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class Restarts(Collector):
    """How often front ends were restarted: kept in a file of the front ends' shared folder, so that whichever
    front end takes a scrape reports it."""

    def __init__(self, folder: str) -> None:
        self._file = Path(folder) / "front-end-restarts"

    def add(self) -> None:
        """One more (the first front end, the only writer)."""
        self._file.write_text(str(self.count() + 1))

    def count(self) -> int:
        try:
            return int(self._file.read_text())
        except (OSError, ValueError):
            return 0

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(PREFIX + "front_end_restarts", "Front ends (--api-servers) restarted after they "
                                  "died.", value=self.count())


class FirstServes:
    """Whether front end 0 serves yet: a file of the front ends' shared folder, made when its engine is ready. The
    others take connections only after that (and their own engine's start): one ready first answered /health 200 on
    the shared port while front end 0 still refused requests there (503, still loading)."""

    def __init__(self, folder: str) -> None:
        self._file = Path(folder) / "first-front-end-serves"

    def mark(self) -> None:
        """Front end 0 serves (its engine is ready)."""
        self._file.touch()

    async def wait(self) -> None:
        while not self._file.exists():
            await asyncio.sleep(FIRST_SERVES_POLL)


class FrontEnds:
    """Front ends 1..N-1, seen from the first: started, restarted when they die, told to stop, waited for."""

    def __init__(self, settings: Settings, folder: str, sock: socket.socket) -> None:
        self.count = settings.api_servers
        self.stopping = False
        self.restarts = Restarts(folder)
        self.first_serves = FirstServes(folder)
        self._settings, self._folder, self._sock = settings, folder, sock
        self._lock = threading.Lock()  # _procs: replaced by the watchers, read by signal() and _wait_all()
        self._procs = [self._start(index) for index in range(1, self.count)]

    def _start(self, index: int) -> subprocess.Popen[bytes]:
        child = _Child(self._settings, index, self.count, self._folder, self._sock.fileno(), os.getpid())
        proc = subprocess.Popen([sys.executable, "-m", "gateway.api_servers"], stdin=subprocess.PIPE,
                                pass_fds=(self._sock.fileno(),))
        assert proc.stdin is not None
        proc.stdin.write(msgspec.msgpack.encode(child))
        proc.stdin.close()
        return proc

    def watch(self) -> None:
        """Restart (from a thread) each front end that exits while we are not stopping."""
        for index in range(1, self.count):
            threading.Thread(target=self._supervise, args=(index,), name=f"front-end-{index}", daemon=True).start()

    def _supervise(self, index: int) -> None:
        pause = 0.0
        while True:
            started = time.monotonic()
            with self._lock:
                proc = self._procs[index - 1]
            code = proc.wait()
            if self.stopping:
                return
            pause = 0.0 if time.monotonic() - started > RESTART_WINDOW else min(max(2 * pause, 1.0),
                                                                                MAX_RESTART_PAUSE)
            log.error("front end %d of %d (process %d) exited unexpectedly with code %s; restarting it%s", index + 1,
                      self.count, proc.pid, code, f" in {pause:.0f} s" if pause else "")
            time.sleep(pause)
            with self._lock:
                if self.stopping:
                    return
                self._procs[index - 1] = self._start(index)
            self.restarts.add()

    def signal(self) -> None:
        """Forward SIGTERM once: the others drain as this one does (a second one would cut their drain short)."""
        with self._lock:
            if self.stopping:
                return
            self.stopping = True
            procs = list(self._procs)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    async def wait(self, timeout: float) -> None:
        """Until every other front end has exited (killed past `timeout`): the core must outlive them."""
        self.signal()
        await asyncio.to_thread(self._wait_all, timeout)

    def _wait_all(self, timeout: float) -> None:
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("front end process %d did not exit in %.0f s; killing it", proc.pid, timeout)
                proc.kill()
                proc.wait()

    def stop(self, timeout: float) -> bool:
        """Signal, wait (killing past `timeout`: one still starting would wait for a core that never comes);
        whether any ended badly."""
        self.signal()
        self._wait_all(timeout)
        with self._lock:
            return any(proc.returncode for proc in self._procs)


def serve_many(settings: Settings) -> int:
    """Run front end 0 here and the others in their own processes (see the module docstring)."""
    from gateway.cli import STOP_GRACE_S, run_server

    engine = settings.engine
    if engine.backend != "native" or not engine.engine_process:
        print("trtllm-gateway: error: --api-servers above 1 needs the native backend with its engine core in its "
              "own process (--engine-process)", file=sys.stderr)
        return 2
    sock = listening_socket(settings.host, settings.port)
    folder = tempfile.mkdtemp(prefix="trtllm-gateway-")
    others = FrontEnds(settings, folder, sock)
    code = run_server(settings, EngineClient(engine, FrontEnd(0, others.count, folder)), sock, others)
    return code or int(others.stop(STOP_GRACE_S))


def drain_when_orphaned(parent_pid: int, grace: float) -> threading.Event:
    """Within PARENT_POLL s of the first front end's death, drain as on SIGTERM (the streams in flight end properly:
    the core goes with the first, which fails them with an error event), and exit 1 if that takes past `grace` s.
    The event tells that it happened."""
    orphaned = threading.Event()

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL)
        orphaned.set()
        log.error("the first front end is gone; draining, then exiting")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    return orphaned


def main() -> int:
    """Entry point of front ends 1..N-1 (started by serve_many, never by hand)."""
    from gateway.cli import STOP_GRACE_S, run_server

    child = msgspec.msgpack.decode(sys.stdin.buffer.read(), type=_Child)
    orphaned = drain_when_orphaned(child.parent_pid, child.settings.drain_timeout + STOP_GRACE_S)
    sock = socket.socket(fileno=child.fd)
    engine = EngineClient(child.settings.engine, FrontEnd(child.index, child.count, child.folder))
    code = run_server(child.settings, engine, sock, None, index=child.index, restarts=Restarts(child.folder),
                      serve_after=FirstServes(child.folder).wait)
    return 1 if orphaned.is_set() else code


if __name__ == "__main__":
    sys.exit(main())
