"""benchmarks/gpu_load_profile.py in seconds on the CPU: every phase (the timed load with its step split, the profiled
one, TTFT, closed-loop ITL, the 512-stream mix and the engine core in its own process) runs on a tiny shape and writes
its figures (they mean nothing here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import runtime.native.core_loader
from benchmarks import gpu_load_profile
from tests.benchmarks.smoke import positive

pytestmark = pytest.mark.benchmark_smoke


@pytest.fixture(autouse=True)
def _restore_load_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """The script loads random weights by replacing core_loader.load_model process-wide: later engines of this
    process (other test files on this worker) must load their checkpoints again (without this, 11 of
    test_llm_engine's transformers comparisons failed after the mix-only test)."""
    monkeypatch.setattr(runtime.native.core_loader, "load_model", runtime.native.core_loader.load_model)


def test_every_phase_runs_and_writes_its_figures(tmp_path: Path) -> None:
    shape = "llama-3.1-8b"
    assert gpu_load_profile.main(["--smoke", "--device", "cpu", "--out", str(tmp_path), "--shapes", shape,
                                  "--mix-shapes", shape, "--core-shapes", shape]) == 0
    r = json.loads((tmp_path / "gpu_load_profile.json").read_text())
    load = r[f"{shape}_t2048_throughput_8"]  # the engine's default on CPU
    assert positive(load["tok_s"], load["prefill_s"], load["decode_s"]) and load["prefill_tokens"] == 8 * 16
    assert load["steps"] == load["prefill_steps"] + load["decode_steps"]
    assert positive(r[f"{shape}_ttft_32"]["vs_floor"], r[f"{shape}_mix_4_kv_auto"]["itl_ms_p99"],
                    r[f"core_{shape}_throughput_8"]["tok_s"], r[f"core_{shape}_itl_8"]["itl_ms_p50"])


def test_the_mix_alone_runs_once_per_kv_dtype_and_reports_its_cache(tmp_path: Path) -> None:
    """--mix-only: no other phase; the KV fraction names the figures (issue 44: where bf16 runs out of blocks)."""
    shape = "llama-3.1-8b"
    assert gpu_load_profile.main(["--smoke", "--device", "cpu", "--out", str(tmp_path), "--shapes", shape,
                                  "--mix-only", "--mix-kv-dtypes", "auto,fp8", "--mix-kv-fraction", "0.4"]) == 0
    r = json.loads((tmp_path / "gpu_load_profile.json").read_text())
    mixes = [f"{shape}_mix_4_kv_{kv}_of_0.4" for kv in ("auto", "fp8")]
    assert sorted(k for k in r if k not in ("device", "sizes", "date")) == mixes
    assert all(r[k]["kv_tokens"] == 8192 and positive(r[k]["tok_s"]) for k in mixes)  # CPU: max_kv_tokens 8192


def test_kernels_are_sorted_into_kinds_and_the_gaps_counted(tmp_path: Path) -> None:
    """GPU time by kind and the busy time from a chrome trace's kernel events (two overlap, a 5 us gap)."""
    events = [{"cat": "kernel", "name": "nvjet_sm90_tst_256x128", "ts": 0.0, "dur": 10.0},
              {"cat": "kernel", "name": "_rope_decode_kernel", "ts": 5.0, "dur": 10.0},
              {"cat": "kernel", "name": "_add_rms_norm_kernel", "ts": 20.0, "dur": 5.0},
              {"cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 50.0}]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    summary = gpu_load_profile.kernel_summary(trace)
    assert summary["kernels"] == 3 and summary["span_ms"] == pytest.approx(0.025)
    assert summary["busy_ms"] == pytest.approx(0.020) and summary["idle_share"] == pytest.approx(0.2)
    assert summary["by_kind_ms"] == {"gemm": 0.01, "attention": 0.01, "norm/act/rope": 0.01}
