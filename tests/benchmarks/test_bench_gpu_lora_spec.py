"""benchmarks/gpu_lora_spec.sh and gpu_moe.sh, the device drivers for issues 6 and 7 and for issue 43's MoE figures,
cannot run here (CUDA); they are checked statically: bash parses each, and every `python -m benchmarks.X --flag` it
runs names a script and options that exist."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.benchmarks.smoke import REPO_ROOT

pytestmark = pytest.mark.benchmark_smoke

SCRIPTS = [REPO_ROOT / "benchmarks" / name for name in ("gpu_lora_spec.sh", "gpu_moe.sh")]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_bash_parses_it(script: Path) -> None:
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_scripts_and_options_exist(script: Path) -> None:
    # a command may continue over lines ending in a backslash
    commands = re.findall(r"python -m benchmarks\.(\w+)((?:[^\n]*\\\n)*[^\n]*)", script.read_text())
    assert commands
    for module, args in commands:
        spec = importlib.util.find_spec(f"benchmarks.{module}")
        assert spec is not None and spec.origin, module
        source = open(spec.origin).read()
        for flag in set(re.findall(r"(?<![\w-])--[a-z][\w-]*", args)):
            assert f'"{flag}"' in source, f"{module} has no option {flag}"
