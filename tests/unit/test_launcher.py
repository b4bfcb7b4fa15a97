"""runtime/process/launcher.py: a child forked from the zygote gets what `python -m` of its module would (the
launcher's current environment, working folder, stdout and stderr), carries its name, and reports its exit code,
or minus the signal that killed it, as subprocess does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.process import launcher
from runtime.process.launcher import launch


def report(args: bytes) -> int:
    """An entry that prints what its process got, then exits with the code `args` names."""
    print(json.dumps({"probe": os.environ.get("LAUNCH_PROBE"), "cwd": os.getcwd(),
                      "name": Path("/proc/self/comm").read_text().strip(), "parent": os.getppid()}), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    return int(args)


def sleep(args: bytes) -> int:
    time.sleep(float(args))
    return 0


def test_a_child_gets_the_launchers_environment_folder_and_output(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    assert launch("probe-child", "tests.unit.test_launcher:report", b"0").wait(60) == 0  # the zygote runs by now
    monkeypatch.setenv("LAUNCH_PROBE", "set after the zygote started")
    monkeypatch.chdir(tmp_path)
    child = launch("probe-child", "tests.unit.test_launcher:report", b"3")
    assert child.wait(60) == 3 and child.returncode == 3 and child.poll() == 3
    out, err = capfd.readouterr()
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["probe"] == "set after the zygote started" and seen["cwd"] == str(tmp_path)
    assert seen["name"] == "probe-child" and seen["parent"] != os.getpid()  # (its OS parent is the zygote)
    assert "to stderr" in err


def test_a_killed_child_reports_the_signal_and_a_running_one_times_out() -> None:
    child = launch("probe-sleeper", "tests.unit.test_launcher:sleep", b"60")
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.2)
    child.kill()
    assert child.wait(30) == -signal.SIGKILL


def test_the_zygote_exits_by_itself_when_its_launcher_lets_it_go() -> None:
    """At the launcher's exit (close()): not killed after ZYGOTE_EXIT s, which every server's stop once waited."""
    zygote = launcher._Zygote()
    assert zygote.launch(launcher.Launch("probe-child", "tests.unit.test_launcher:report", b"0", dict(os.environ),
                                         os.getcwd())).wait(60) == 0
    zygote.close()
    assert zygote.process.returncode == 0
