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
ignore SIGINT (a terminal's Ctrl-C reaches the whole group; the forwarded SIGTERM is theirs), and exit
when the first is gone. A front end that dies makes the first exit non-zero; the core dying makes every
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
from collections.abc import Callable

import msgspec

from gateway.settings import Settings
from runtime.process.client import EngineClient, FrontEnd
from runtime.process.parent import exit_when_orphaned

log = logging.getLogger("gateway.api_servers")

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


class FrontEnds:
    """Front ends 1..N-1, seen from the first: started, watched, told to stop, waited for."""

    def __init__(self, settings: Settings, folder: str, sock: socket.socket) -> None:
        self.count = settings.api_servers
        self.stopping = False
        self._procs: list[subprocess.Popen[bytes]] = []
        for index in range(1, self.count):
            child = _Child(settings, index, self.count, folder, sock.fileno(), os.getpid())
            proc = subprocess.Popen([sys.executable, "-m", "gateway.api_servers"], stdin=subprocess.PIPE,
                                    pass_fds=(sock.fileno(),))
            assert proc.stdin is not None
            proc.stdin.write(msgspec.msgpack.encode(child))
            proc.stdin.close()
            self._procs.append(proc)

    def watch(self, on_death: Callable[[str], None]) -> None:
        """Call `on_death(why)` (from a thread) when a front end exits while we are not stopping."""
        def wait(proc: subprocess.Popen[bytes], index: int) -> None:
            code = proc.wait()
            if not self.stopping:
                on_death(f"front end {index} (process {proc.pid}) exited unexpectedly with code {code}")

        for index, proc in enumerate(self._procs, start=1):
            threading.Thread(target=wait, args=(proc, index), name=f"front-end-{index}", daemon=True).start()

    def signal(self) -> None:
        """Forward SIGTERM once: the others drain as this one does (a second one would cut their drain short)."""
        if self.stopping:
            return
        self.stopping = True
        for proc in self._procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    async def wait(self, timeout: float) -> None:
        """Until every other front end has exited (killed past `timeout`): the core must outlive them."""
        self.signal()
        await asyncio.to_thread(self._wait_all, timeout)

    def _wait_all(self, timeout: float) -> None:
        for proc in self._procs:
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


def main() -> int:
    """Entry point of front ends 1..N-1 (started by serve_many, never by hand)."""
    from gateway.cli import run_server

    child = msgspec.msgpack.decode(sys.stdin.buffer.read(), type=_Child)
    exit_when_orphaned(child.parent_pid)
    sock = socket.socket(fileno=child.fd)
    engine = EngineClient(child.settings.engine, FrontEnd(child.index, child.count, child.folder))
    return run_server(child.settings, engine, sock, None, index=child.index)


if __name__ == "__main__":
    sys.exit(main())
