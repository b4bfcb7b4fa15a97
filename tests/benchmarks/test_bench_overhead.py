"""benchmarks/overhead.py: the gateway over the SyntheticEngine against the Starlette ceilings, one short point
each, the RESULTS.md section written to a scratch file. Its servers are real uvicorn processes; the load
generator runs in this process (conftest.load_generator_here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import overhead

pytestmark = pytest.mark.benchmark_smoke


def test_points_table_and_results_section(tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          load_generator_here: None, capsys: pytest.CaptureFixture[str]) -> None:
    results_md = tmp_path / "RESULTS.md"
    monkeypatch.setattr(overhead, "RESULTS_MD", results_md)
    monkeypatch.setattr(overhead, "RESULTS_DIR", tmp_path)
    code = overhead.main(["--tokenizer", str(tiny_model), "--duration", "0.3", "--repeat", "1", "--concurrency", "2",
                          "--input-tokens", "8", "--output-tokens", "4", "--nostream-output-tokens", "2",
                          "--append-results"])
    assert code == 0
    section = results_md.read_text()
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| stream c=2 |")
            or line.startswith("| no-stream c=1 |")]
    servers = {row[1] for row in rows}
    assert servers == {"gateway", "ceiling", "ceiling-sse-starlette"}, section
    for row in rows:
        assert float(row[3]) > 0 and row[-1].rstrip(" |") == "0", row  # req/s, and no failed request
    assert "stream c=2: events/s gateway/ceiling = " in section and "no-stream c=1: added p50 latency" in section
    assert "gateway overhead (medians)" in capsys.readouterr().out
