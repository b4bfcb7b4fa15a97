"""A line per finished test file instead of a dot per test, in one process or under pytest-xdist:

    [ 2:31]  41/97 files   612/1130 tests  tests/unit/test_gguf.py: 7 passed (33.0 s)

Failures still print F or E where they happen and in full at the end; -v still prints a line per test.
Under xdist the controller prints the lines (each file's test count comes from the workers' collection).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest


class FileProgress:
    """Counts finished tests per file; prints a file's line when its last test has finished."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.started = time.monotonic()
        self.expected: Counter[str] = Counter()  # test file -> its tests
        self.done: Counter[str] = Counter()
        self.outcomes: dict[str, Counter[str]] = {}
        self.seconds: Counter[str] = Counter()
        self.marked: dict[str, str] = {}  # node id -> "failed" / "skipped", from any of its phases

    def expect(self, node_ids: list[str]) -> None:
        if not self.expected:  # every xdist worker collects the same tests
            self.expected.update(node_id.split("::")[0] for node_id in node_ids)

    def record(self, report: pytest.TestReport) -> None:
        path = report.nodeid.split("::")[0]
        self.seconds[path] += report.duration
        if report.failed:
            self.marked[report.nodeid] = "failed"
        elif report.skipped:
            self.marked.setdefault(report.nodeid, "skipped")
        if report.when != "teardown":
            return
        self.outcomes.setdefault(path, Counter())[self.marked.pop(report.nodeid, "passed")] += 1
        self.done[path] += 1
        if self.done[path] == self.expected.get(path):
            self._print(path)

    def _print(self, path: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        minutes, seconds = divmod(int(time.monotonic() - self.started), 60)
        files_done = sum(1 for p, n in self.done.items() if n == self.expected.get(p))
        counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(self.outcomes[path].items()))
        reporter.ensure_newline()
        reporter.write_line(f"[{minutes:2d}:{seconds:02d}] {files_done:3d}/{len(self.expected)} files "
                            f"{sum(self.done.values()):5d}/{sum(self.expected.values())} tests  "
                            f"{path}: {counts} ({self.seconds[path]:.1f} s)")


_progress: FileProgress | None = None  # in the process that prints: this one, or the xdist controller


def pytest_configure(config: pytest.Config) -> None:
    global _progress
    if not hasattr(config, "workerinput"):  # an xdist worker reports to the controller
        _progress = FileProgress(config)


def pytest_collection_finish(session: pytest.Session) -> None:
    if _progress is not None:
        _progress.expect([item.nodeid for item in session.items])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    if _progress is not None:
        _progress.expect(ids)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _progress is not None:
        _progress.record(report)


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> tuple[str, str, str] | None:
    """No dot for a test that passed or was skipped: its file's line counts it (xfail and -v as usual)."""
    if _progress is None or config.get_verbosity() > 0 or hasattr(report, "wasxfail"):
        return None
    if report.skipped:
        return "skipped", "", "SKIPPED"
    if report.passed:
        return ("passed", "", "PASSED") if report.when == "call" else ("", "", "")
    return None
