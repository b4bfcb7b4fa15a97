"""benchmarks/gpu_parallel.sh in seconds on the CPU: gpu_bench's HTTP load against one engine core and against two
(--data-parallel-size 2, both on the CPU here), and the line with their ratio (timings mean nothing here)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.benchmarks.smoke import REPO_ROOT, positive

pytestmark = pytest.mark.benchmark_smoke


def test_one_core_and_two_serve_the_load_and_the_ratio_is_printed(tmp_path: Path) -> None:
    env = {**os.environ, "SMOKE": "1", "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"),
           "TRTLLM_GATEWAY_CPU_COMPILE": "false"}
    done = subprocess.run(["bash", "benchmarks/gpu_parallel.sh"], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0 and "gpu_bench rc 0" in done.stdout, done.stdout + done.stderr
    result = json.loads((tmp_path / "out" / "bench" / "gpu_bench.json").read_text())
    for phase in ("http_batch", "http_batch_dp2"):
        summary = result[phase]["summary"]
        assert summary["failed"] == 0 and positive(summary["output_token_throughput"])
    assert re.search(r"one core [\d.]+ tok/s, two cores [\d.]+ tok/s, ratio [\d.]+", done.stdout), done.stdout
