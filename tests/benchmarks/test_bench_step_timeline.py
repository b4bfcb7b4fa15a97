"""benchmarks/step_timeline.py: its increments on a made-up profile of known spans, and the whole run in seconds on
the CPU (a tiny shape op by op: its figures mean nothing there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import step_timeline
from tests.benchmarks.smoke import positive

pytestmark = pytest.mark.benchmark_smoke


def test_increments_are_charged_to_their_place_in_a_layer_and_add_up_to_the_step() -> None:
    """Three steps of two layers (q/k/v, attention, o) between an embedding and a head, each kernel starting 1 us
    before the one before it ends (programmatic dependent launches): increments, not durations, by place."""
    names = ["embed", "gemv", "_rope_decode_kernel", "gemv", "gemv", "_rope_decode_kernel", "gemv", "head"]
    durations = [2.0, 5.0, 3.0, 4.0, 5.0, 3.0, 4.0, 10.0]
    spans, end = [], 0.0
    for _ in range(3):
        for i, (name, duration) in enumerate(zip(names, durations)):
            start = end + 2.0 if i == 0 else end - 1.0
            end = start + duration
            spans.append((name, start, end))
    result = step_timeline.timeline(spans, 3)
    assert (result["kernels_per_step"], result["layers"], result["layer_period"]) == (8, 2, 3)
    assert [(p["place"], p["name"], p["increment_us_per_layer"], p["duration_us_per_layer"])
            for p in result["by_place"]] == [(0, "gemv", 4.0, 5.0), (1, "_rope_decode_kernel", 2.0, 3.0),
                                             (2, "gemv", 3.0, 4.0)]
    assert result["outside_layers"] == [{"name": "embed", "increment_us_per_step": 4.0},
                                        {"name": "head", "increment_us_per_step": 9.0}]
    assert result["sum_us"] == 31.0  # a step's span: from the last kernel of the step before to its own last


def test_the_smoke_run_writes_its_figures(tmp_path: Path) -> None:
    assert step_timeline.main(["--smoke", "--steps", "3", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "step_timeline.json").read_text())
    assert positive(result["step_us"], result["floor_us"], result["vs_floor"], result["kernels_per_step"],
                    result["sum_us"])
    assert result["outside_layers"]  # on the CPU no operator is named like an attention kernel: all outside
