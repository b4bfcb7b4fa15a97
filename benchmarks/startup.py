"""How long `gateway serve` takes to start, as a user sees it:

    python -m benchmarks.startup                          # the default model, caches as they are (a warm restart)
    python -m benchmarks.startup --cold                   # a first start: empty GGUF, kernel and compile caches
    python -m benchmarks.startup -- --model demo          # anything after -- goes to `serve`

Polls GET /health every 0.1 s and reports when the port opened, when the server turned ready (200), when it had
nothing left to build in the background (no "phase": the CPU's compiled steps serving), each phase /health named
with the second it was first seen, and the server's CPU seconds (all its processes; a less noisy figure than
wall time on a shared machine). Once settled it sends one short completion and reports each process's RSS at idle
(`rss_mb`: the server's own process first, i.e. the front end when the engine core runs apart). Prints one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks.procs import REPO_ROOT, free_port


def _cpu_seconds(proc: psutil.Process, seen: dict[int, float]) -> float:
    """User + system seconds of `proc` and its descendants; `seen` keeps those of processes that exited."""
    for p in [proc, *proc.children(recursive=True)]:
        try:
            times = p.cpu_times()
        except psutil.Error:
            continue
        seen[p.pid] = times.user + times.system
    return round(sum(seen.values()), 1)


def _rss_after_one_request(url: str, proc: psutil.Process) -> dict[str, float]:
    """RSS (MB) of `proc` and each descendant, by name and pid, 2 s after one short completion."""
    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    body = {"model": model, "prompt": "Hello", "max_tokens": 8}
    httpx.post(f"{url}/v1/completions", json=body, timeout=120).raise_for_status()
    time.sleep(2)
    return {f"{'server' if p.pid == proc.pid else 'child'} {p.pid}": round(p.memory_info().rss / 2**20, 1)
            for p in [proc, *proc.children(recursive=True)]}


def measure(serve_args: list[str], env: dict[str, str], timeout: float, log: Path) -> dict[str, Any]:
    port = free_port()
    started = time.monotonic()
    with log.open("w") as out:
        server = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--port", str(port), "--grpc-port", "none",
                                   *serve_args], cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=out)
    proc, seen = psutil.Process(server.pid), {}
    result: dict[str, Any] = {"port_open_s": None, "ready_s": None, "settled_s": None, "phases": []}
    # one client for the polls: httpx.get builds one a call, and with it an SSL context (~20 ms of CPU, taken
    # from the server being measured on a small machine)
    http = httpx.Client(timeout=5, limits=httpx.Limits(max_keepalive_connections=0))
    try:
        while time.monotonic() - started < timeout and server.poll() is None:
            try:
                r = http.get(f"http://127.0.0.1:{port}/health")
            except httpx.HTTPError:
                time.sleep(0.1)
                continue
            now = round(time.monotonic() - started, 1)
            result["port_open_s"] = result["port_open_s"] or now
            body = r.json()
            if body.get("phase") and (not result["phases"] or result["phases"][-1][1] != body["phase"]):
                result["phases"].append((now, body["phase"]))
            if r.status_code == 200 and result["ready_s"] is None:
                result["ready_s"], result["cpu_s_at_ready"] = now, _cpu_seconds(proc, seen)
            if r.status_code == 200 and "phase" not in body:
                result["settled_s"] = now
                break
            time.sleep(0.1)
        result["cpu_s_at_settled"] = _cpu_seconds(proc, seen)
        if result["settled_s"] is not None:
            result["rss_mb"] = _rss_after_one_request(f"http://127.0.0.1:{port}", proc)
    finally:
        http.close()
        server.terminate()
        server.wait(60)
    result["start_up_log"] = [line.split("start-up: ", 1)[1].strip() for line in log.read_text().splitlines()
                              if "start-up: " in line]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.startup", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cold", action="store_true",
                        help="empty caches (GGUF conversion, C++ kernel build, torch.compile's) in a temporary folder")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the server to settle")
    parser.add_argument("serve_args", nargs="*", help="`serve` arguments (after --)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        if args.cold:
            env.update(XDG_CACHE_HOME=f"{tmp}/xdg", TORCH_EXTENSIONS_DIR=f"{tmp}/extensions",
                       TORCHINDUCTOR_CACHE_DIR=f"{tmp}/inductor")
        result = measure(args.serve_args, env, args.timeout, Path(tmp) / "server.log")
    print(json.dumps({"serve_args": args.serve_args, "cold": args.cold, **result}), flush=True)
    return 0 if result["settled_s"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())
