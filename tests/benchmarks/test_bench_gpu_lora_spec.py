"""benchmarks/gpu_lora_spec.sh, the device driver for issues 6 and 7, cannot run here (CUDA); it is checked
statically: bash parses it, and every `python -m benchmarks.X --flag` it runs names a script and options that exist."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess

import pytest

from tests.benchmarks.smoke import REPO_ROOT

pytestmark = pytest.mark.benchmark_smoke

SCRIPT = REPO_ROOT / "benchmarks" / "gpu_lora_spec.sh"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_parses_it() -> None:
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_scripts_and_options_exist() -> None:
    # a command may continue over lines ending in a backslash
    commands = re.findall(r"python -m benchmarks\.(\w+)((?:[^\n]*\\\n)*[^\n]*)", SCRIPT.read_text())
    assert commands
    for module, args in commands:
        spec = importlib.util.find_spec(f"benchmarks.{module}")
        assert spec is not None and spec.origin, module
        source = open(spec.origin).read()
        for flag in set(re.findall(r"(?<![\w-])--[a-z][\w-]*", args)):
            assert f'"{flag}"' in source, f"{module} has no option {flag}"
