"""tools/lock.py check: whether this Python holds the locked versions (`make install` skips pip only then)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """tools/lock.py with its lock file in tmp_path (written by each test)."""
    spec = importlib.util.spec_from_file_location("lock_tool", ROOT / "tools" / "lock.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "LOCK", tmp_path / "constraints.txt")
    return module


def test_check_passes_only_when_every_pin_is_installed_at_its_version(lock: ModuleType,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    pytest_version = importlib.metadata.version("pytest")
    lock.LOCK.write_text(f"# a comment\n\nPyTest=={pytest_version}\n")  # names compare canonically
    assert lock.check() == 0
    assert lock.check("pytest==0.0.1") == 1  # a requirement named beside the lock
    assert f"pytest {pytest_version} is installed, 0.0.1 locked" in capsys.readouterr().err
    lock.LOCK.write_text(f"pytest=={pytest_version}\nno-such-package-for-the-lock-test==1.0\n")
    assert lock.check() == 1
    assert "no-such-package-for-the-lock-test is missing" in capsys.readouterr().err


def test_make_install_installs_with_the_lock_and_the_lock_pins_the_test_tools() -> None:
    """A fresh install resolved pytest 9.2.0 unpinned, and the suite failed on it: the lock decides, on purpose."""
    makefile = (ROOT / "Makefile").read_text()
    assert "tools/lock.py check" in makefile and "pip install -c constraints.txt -e '.[test]'" in makefile
    pins = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    assert {"pytest", "pytest-xdist", "pytest-asyncio", "torch"} <= set(pins)
