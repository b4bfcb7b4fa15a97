"""benchmarks/gpu_parallel.sh in seconds on the CPU (SMOKE=1): gpu_bench's HTTP load against two engine cores
(--data-parallel-size 2, both on the CPU here), and the ratio line, which reads None for the one-core side: SMOKE
leaves out http_batch, the same phase code with one flag fewer (timings mean nothing here). This is the smoke run of
gpu_bench's HTTP phase code (gateway() -> http_phase -> http_load, its load generator in its own process), which
test_bench_gpu_bench.py leaves out."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.benchmarks.smoke import REPO_ROOT, positive

pytestmark = pytest.mark.benchmark_smoke


def test_two_cores_serve_the_load_and_the_ratio_line_is_printed(tmp_path: Path, smoke_work: Path) -> None:
    env = {**os.environ, "SMOKE": "1", "OUT": str(tmp_path / "out"), "WORK": str(smoke_work),
           "TRTLLM_GATEWAY_CPU_COMPILE": "false"}
    done = subprocess.run(["bash", "benchmarks/gpu_parallel.sh"], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0 and "gpu_bench rc 0" in done.stdout, done.stdout + done.stderr
    result = json.loads((tmp_path / "out" / "bench" / "gpu_bench.json").read_text())
    assert set(result["phase_s"]) == {"http_batch_dp2"} and result["failed_phases"] == []
    summary = result["http_batch_dp2"]["summary"]
    assert summary["failed"] == 0 and positive(summary["output_token_throughput"])
    assert re.search(r"one core None tok/s, two cores [\d.]+ tok/s, ratio None", done.stdout), done.stdout
