"""Processes for benchmarks: a uvicorn server on a free loopback port (with its CPU time read from
/proc), and the load generator run as a separate process (its CPU time from rusage)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` (all its threads) so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """A uvicorn server in a subprocess; `base_url` includes any path prefix given."""

    def __init__(self, app: str, *, factory: bool = False, env: dict[str, str] | None = None,
                 prefix: str = "", wrap: list[str] | None = None, command: list[str] | None = None,
                 ready_path: str = "/v1/models", cwd: Path = REPO_ROOT) -> None:
        """`app` is a uvicorn "module:attr"; or pass `command` (any server; "{port}" in it is replaced), run in
        `cwd` (another tree of this repository, say)."""
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}{prefix}"
        self.ready_path = ready_path
        if command is not None:
            cmd = [a.replace("{port}", str(self.port)) for a in command]
        else:
            cmd = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(self.port),
                   "--log-level", "warning", "--no-access-log"] + (["--factory"] if factory else [])
        self.cmd = (wrap or []) + cmd
        self.proc = subprocess.Popen(self.cmd, cwd=cwd, env={**os.environ, **(env or {})})
        self._server_pid: int | None = None

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        # one client for the polls: httpx.get builds one a call, and with it an SSL context (~20 ms of CPU)
        with httpx.Client(timeout=2, limits=httpx.Limits(max_keepalive_connections=0)) as http:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited with {self.proc.returncode}: {' '.join(self.cmd)}")
                try:
                    r = http.get(self.base_url + self.ready_path)
                    # the gateway's /health names a "phase" while it still builds faster steps in the background
                    if r.status_code == 200 and "phase" not in (
                            r.json() if "json" in r.headers.get("content-type", "") else {}):
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.25)
        raise TimeoutError(f"server not ready after {timeout} s: {' '.join(self.cmd)}")

    @property
    def server_pid(self) -> int:
        """The uvicorn process (a child of the wrapper, e.g. py-spy, when wrapped)."""
        if self._server_pid is None:
            pid = self.proc.pid
            for _ in range(5):  # follow single-child chains down to the python process
                kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
                if not kids:
                    break
                pid = int(kids[0])
            self._server_pid = pid
        return self._server_pid

    def cpu_seconds(self) -> float:
        """User + system CPU time so far of the process started and its descendants (a gateway's front ends and
        engine core), all their threads."""
        return sum(_cpu_seconds(pid) for pid in self._tree())

    def rss_bytes(self) -> int:
        """Resident memory now of the process started and all its descendants (a gateway's front ends and engine
        core), each counted whole (VmRSS)."""
        total = 0
        for pid in self._tree():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except (FileNotFoundError, ProcessLookupError):  # it exited meanwhile
                continue
            total += int(status.split("VmRSS:", 1)[1].split()[0]) * 1024 if "VmRSS:" in status else 0
        return total

    def _tree(self) -> list[int]:
        """The process started and its descendants now."""
        found, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            try:
                todo += [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
            except (FileNotFoundError, ProcessLookupError):
                pass
        return found

    def front_end_cpu_seconds(self) -> float:
        """CPU time so far of the gateway's HTTP front ends: the process started and its descendants, less the
        engine core and anything below the zygote it forks from (`python -m runtime.native.zygote`)."""
        total, todo = 0.0, [self.proc.pid]
        while todo:
            pid = todo.pop()
            try:
                if b"runtime.native.zygote" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    continue
                total += _cpu_seconds(pid)
                todo += [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
            except (FileNotFoundError, ProcessLookupError):  # it exited meanwhile
                pass
        return total

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(2)  # SIGINT: uvicorn (and py-spy) shut down cleanly
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def run_load_generator(argv: list[str], timeout: float = 600.0) -> dict[str, Any]:
    """Run `python -m benchmarks.serve ARGV --quiet --json TMP` in its own process; returns its JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        subprocess.run([sys.executable, "-m", "benchmarks.serve", *argv, "--quiet", "--json", str(out)],
                       cwd=REPO_ROOT, check=True, timeout=timeout)
        return json.loads(out.read_text())
