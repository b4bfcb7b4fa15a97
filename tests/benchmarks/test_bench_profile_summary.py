"""benchmarks/profile_summary.py on a small py-spy raw profile written here."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import profile_summary

pytestmark = pytest.mark.benchmark_smoke

RAW = """\
thread (0x1): "MainThread";run (uvicorn/server.py:10);handle (gateway/routes.py:20);encode (json/encoder.py:5) 30
thread (0x1): "MainThread";run (uvicorn/server.py:10);handle (gateway/routes.py:21) 10
thread (0x2): "engine";step (runtime/native/llm_engine.py:300) 60
"""


def test_self_and_inclusive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "prof.txt"
    path.write_text(RAW)
    total, self_c, incl_c = profile_summary.summarise(str(path), "MainThread", "gateway/")
    assert total == 40 and self_c == {"handle (gateway/routes.py)": 40}
    assert incl_c["run (uvicorn/server.py)"] == 40
    assert profile_summary.main([str(path), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("100 samples") and "60.0%  step (runtime/native/llm_engine.py)" in out


def test_empty_profile_fails(tmp_path: Path) -> None:
    path = tmp_path / "empty.txt"
    path.write_text("")
    assert profile_summary.main([str(path)]) == 1
