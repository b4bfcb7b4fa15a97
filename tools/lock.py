"""constraints.txt: the version of every package `make install` installs, and whether an environment has them.

    python tools/lock.py write    # `make lock`: resolve pyproject.toml's dependencies and test extra afresh
    python tools/lock.py check [NAME==VERSION ...]   # exit 0 when every pinned package (and those named) is
                                                    # installed at its version; else 1, saying which

`write` asks pip's own resolver (`pip install --dry-run --ignore-installed --report`), so the lock holds what
pip would install into an empty environment of this Python today, with torch pinned to 2.13.0: unpinned, pip
takes a CUDA build of several GB from the index, while this machine's pip finds the CPU build on its disk.
`make install` then installs with `pip install -c constraints.txt -e '.[test]'`: the same versions every time,
until someone runs `make lock` on purpose. `check` lets `make serve` and `make test` skip pip (20 s) when nothing
is missing and the lock has not changed.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "constraints.txt"
PROJECT = "trtllm-gateway"
PINNED_DIRECTLY = ("torch==2.13.0",)  # the CPU build (see the module docstring)
HEADER = """\
# Every package `make install` installs, at the version it installs: pip install -c constraints.txt -e '.[test]'.
# Written by `make lock` (python tools/lock.py write) for Python {python} on {platform}; do not edit by hand:
# change pyproject.toml, then run `make lock` and commit both.
"""


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _public(version: str) -> str:
    """Without a local label (2.13.0+cpu -> 2.13.0): `torch==2.13.0` still lets pip take the local CPU build."""
    return version.split("+", 1)[0]


def write() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                        "--report", str(report), "-e", f"{ROOT}[test]", *PINNED_DIRECTLY], check=True)
        installs = json.loads(report.read_text())["install"]
    pins = sorted((_canonical(item["metadata"]["name"]), _public(item["metadata"]["version"])) for item in installs)
    lines = [f"{name}=={version}" for name, version in pins if name != PROJECT]
    platform = f"{sys.platform} {__import__('platform').machine()}"
    LOCK.write_text(HEADER.format(python=".".join(map(str, sys.version_info[:2])), platform=platform)
                    + "\n".join(lines) + "\n")
    print(f"{LOCK.name}: {len(lines)} packages pinned")
    return 0


def _canonical_pin(pin: str) -> tuple[str, str]:
    name, _, version = pin.partition("==")
    return _canonical(name.strip()), version.strip()


def locked() -> dict[str, str]:
    """{canonical name: version} of constraints.txt."""
    lines = (line.split("#", 1)[0].strip() for line in LOCK.read_text().splitlines())
    return dict(_canonical_pin(line) for line in lines if line)


def check(*also: str) -> int:
    """`also`: requirements installed beside the lock (the default model's wheel, installed without dependencies)."""
    wanted = {**locked(), **dict(_canonical_pin(pin) for pin in also), PROJECT: None}
    wrong = []
    for name, version in wanted.items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            wrong.append(f"{name} is missing")
            continue
        if version is not None and _public(installed) != version:
            wrong.append(f"{name} {installed} is installed, {version} locked")
    if wrong:
        shown = "; ".join(wrong[:5]) + (f"; and {len(wrong) - 5} more" if len(wrong) > 5 else "")
        print(f"installing the locked versions ({LOCK.name}): {shown}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["write"] and len(sys.argv) == 2:
        sys.exit(write())
    if sys.argv[1:2] == ["check"]:
        sys.exit(check(*sys.argv[2:]))
    sys.exit(f"usage: python {Path(__file__).relative_to(ROOT)} write | check [NAME==VERSION ...]")
