"""The front-end process of a started server (`python -m gateway serve`, the engine core in its own process) loads
neither torch nor xgrammar: no shared object of theirs is mapped into it (/proc/PID/maps lists every file a
process maps, whoever imported it), after requests that make text, match a stop string and compile a grammar.
The engine core maps both (the check can see them)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.e2e.conftest import MODEL_NAME, free_port
from tests.e2e.test_shutdown import serve_args, spawn, stop_all, wait_ready, Served

FORBIDDEN = ("libtorch", "xgrammar")  # torch's libtorch*.so, xgrammar's xgrammar_bindings*.so


def mapped_files(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps") as maps:
        return {parts[5] for parts in (line.rstrip("\n").split(maxsplit=5) for line in maps) if len(parts) == 6}


def test_the_front_end_maps_no_torch_or_xgrammar(tiny_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    served = Served(spawn(["-m", "gateway", *serve_args(tiny_model_dir, port)], tmp_path / "server.log"), port)
    try:
        wait_ready(served.url, served.proc)
        body = {"model": MODEL_NAME, "prompt": "the cat", "max_tokens": 12, "temperature": 0, "stop": ["e"]}
        assert httpx.post(served.url + "/v1/completions", json=body, timeout=60).status_code == 200
        body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "a or b?"}], "max_tokens": 8,
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "x", "schema": {"enum": ["a", "b"]}}}}
        reply = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=60)
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] in ('"a"', '"b"')
        front_end, engine_core = mapped_files(served.proc.pid), mapped_files(served.engine_core().pid)
        assert any("python" in f for f in front_end)  # the maps were read
        for name in FORBIDDEN:
            assert any(name in Path(f).name for f in engine_core), name  # visible where they are loaded
            assert not [f for f in front_end if name in Path(f).name], name
    finally:
        stop_all([served])
