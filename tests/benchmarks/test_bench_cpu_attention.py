"""benchmarks/cpu_attention.py in seconds: both backends timed, the table and the RESULTS section."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks import cpu_attention

pytestmark = pytest.mark.benchmark_smoke


def test_both_backends_table_and_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cpu_attention, "RESULTS_MD", tmp_path / "RESULTS.md")
    threads = torch.get_num_threads()
    code = cpu_attention.main(["--rows", "1,4", "--context", "40", "--calls", "3", "--spare-blocks", "8",
                               "--append-results"])
    assert code == 0 and torch.get_num_threads() == threads  # timed on one thread, then given back
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("| 1 |", "| 4 |"))]
    assert len(rows) == 2 and all(line.count("x |") == 1 for line in rows)
    section = (tmp_path / "RESULTS.md").read_text()
    assert "C++ kernel vs gather + SDPA" in section and "| 4 |" in section
