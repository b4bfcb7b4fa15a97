"""benchmarks/lora_step.py on --synthetic tiny (a random Llama written here) with two adapters, decode and
prefill steps, and the --profile tables; --graph is CUDA-only (the script skips it on the CPU)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from benchmarks import lora_step
from tests.benchmarks.smoke import positive

pytestmark = pytest.mark.benchmark_smoke


def test_decode_and_prefill_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where --synthetic writes its checkpoint
    out = tmp_path / "lora.json"
    lora_step.main(["--synthetic", "tiny", "--adapters", "2", "--rank", "4", "--batch", "2", "--context", "16",
                    "--prefill", "16", "--warmup", "1", "--iters", "2", "--profile", "--graph", "--json", str(out)])
    results = json.loads(out.read_text())["results"]
    assert [(r["batch"], r["new_tokens_per_seq"]) for r in results] == [(2, 1), (2, 8)]
    assert all(positive(r["base_ms"], r["lora_ms"], r["ratio"]) for r in results)
    assert "top operators by self_cpu_time_total" in capsys.readouterr().out  # --profile


def test_replayed_hands_the_graphs_the_steps_columns() -> None:
    """On CUDA `replayed` asked the engine's decode graphs about a list of inputs, which they read as columns
    (`'list' object has no attribute 'counts'`); the CPU run never asks (no graphs)."""
    from types import SimpleNamespace

    from runtime.native.step_inputs import StepInput

    class Graphs:  # the engine's DecodeGraphs as `accepts` reads its argument
        def accepts(self, inputs: lora_step.StepInputs) -> bool:
            return inputs.counts == [1, 1]

    engine = SimpleNamespace(runner=SimpleNamespace(graphs=Graphs()))
    rows = [StepInput([5], 3, [0]), StepInput([6], 4, [1])]
    assert lora_step.replayed(engine, rows) == "graph"  # type: ignore[arg-type]
    assert lora_step.replayed(engine, rows[:1]) == "eager"  # type: ignore[arg-type]
