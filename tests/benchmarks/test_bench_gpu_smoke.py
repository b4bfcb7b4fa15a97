"""benchmarks/gpu_smoke.sh without a GPU: the script parses, its entries cover every benchmark module with a CUDA
path (or say why not), and each entry's flags parse with that module's own argparse, so a renamed flag fails here
instead of in a device call."""

from __future__ import annotations

import argparse
import importlib
import inspect
import shlex
import subprocess
import sys
from typing import Any

import pytest

from tests.benchmarks.smoke import REPO_ROOT

SCRIPT = REPO_ROOT / "benchmarks" / "gpu_smoke.sh"
# benchmark modules that mention CUDA but get no entry of their own, and why
NOT_ENTRIES = {"gpu_models": "a library of checkpoints and baselines: the gpu_bench, decode_b1 and http_vs_core "
                             "entries run it on the GPU",
               "cuda_timing": "a library (the event timing loop): every entry that times on the GPU runs it",
               "gpu_int4_gemv": "gpu_quant's int4_gemv phase: the gpu_quant entry runs it on the GPU",
               "int4_gemv_sass": "compiles for sm_90 without a GPU: tests/benchmarks/test_int4_gemv_sass.py runs it",
               "gpu_tp": "needs two GPUs: benchmarks/gpu_tp.sh runs its tests and figures on the 2-GPU machine",
               "nccl_graph_destroy": "needs two GPUs: benchmarks/gpu_tp.sh runs it on the 2-GPU machine"}


class Parsed(Exception):
    """Raised by the patched ArgumentParser.parse_args with the namespace it parsed: the module's main stops there."""

    def __init__(self, namespace: argparse.Namespace) -> None:
        super().__init__()
        self.namespace = namespace


def entries() -> list[tuple[str, int, list[str]]]:
    """`gpu_smoke.sh --list`: (name, time limit, command) per line."""
    out = subprocess.run(["bash", str(SCRIPT), "--list"], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    rows = []
    for line in out.stdout.splitlines():
        name, limit, *command = shlex.split(line)
        rows.append((name, int(limit), command))
    return rows


def module_of(command: list[str]) -> str:
    assert command[:2] == ["python", "-m"] and command[2].startswith("benchmarks."), command
    return command[2].removeprefix("benchmarks.")


def test_the_script_parses() -> None:
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_entries_have_unique_names_and_positive_limits() -> None:
    rows = entries()
    names = [name for name, _, _ in rows]
    assert len(names) == len(set(names)) and all(limit > 0 for _, limit, _ in rows)


def test_every_module_with_a_cuda_path_has_an_entry() -> None:
    with_cuda = {path.stem for path in (REPO_ROOT / "benchmarks").glob("*.py") if "cuda" in path.read_text().lower()}
    covered = {module_of(command) for _, _, command in entries()}
    assert with_cuda - covered - set(NOT_ENTRIES) == set()
    assert set(NOT_ENTRIES) <= with_cuda - covered  # no stale exclusion


def parse(module_name: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """`argv` through the module's own parser: its main() runs up to parse_args, which stops it."""
    module = importlib.import_module(f"benchmarks.{module_name}")
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> argparse.Namespace:
        raise Parsed(original(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(sys, "argv", [module_name, *argv])
    try:
        module.main(argv) if inspect.signature(module.main).parameters else module.main()
    except Parsed as parsed:
        return parsed.namespace
    except SystemExit as exit_:  # argparse's error: an unknown flag or a bad value
        pytest.fail(f"{module_name} {' '.join(argv)}: the module's argparse rejects it (exit {exit_.code})")
    pytest.fail(f"{module_name}.main() returned without calling parse_args")


@pytest.mark.parametrize("name, command", [(name, command) for name, _, command in entries()],
                         ids=[name for name, _, _ in entries()])
def test_each_entry_parses_with_its_module(name: str, command: list[str], monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(module_of(command), command[3:], monkeypatch)
    # modules without --device (gemv_kernels, cuda_decode_attention, decode_b1) take CUDA wherever there is one
    assert getattr(args, "device", None) in (None, "cuda"), f"{name} would not run on the GPU"


def test_a_wrong_flag_fails_the_check(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(pytest.fail.Exception, match="rejects"):
        parse("lora_step", ["--synthetic", "tiny", "--no-such-flag"], monkeypatch)
