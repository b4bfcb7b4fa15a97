"""README.md and docs/*.md hold only what is true of this checkout: every relative link (and #anchor) reaches a
file (and a heading), every `python -m MODULE` names a module that exists, every `trtllm-gateway serve ...` in a
code block parses with the real command line, and the README's lines fit 120 columns."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from gateway.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target); text may span lines
HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)


def _ids(pages: list[Path]) -> list[str]:
    return [str(page.relative_to(ROOT)) for page in pages]


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(h) for h in HEADING.findall(FENCE.sub("", page.read_text()))}


def _commands(page: Path) -> list[str]:
    """The lines of the page's code blocks, with `\\` continuations joined and comments kept for shlex to drop."""
    lines: list[str] = []
    for block in FENCE.findall(page.read_text()):
        for line in block.replace("\\\n", " ").splitlines()[1:-1]:
            lines.append(line.strip())
    return lines


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_relative_links_reach_a_file_and_heading(page: Path) -> None:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not ours to check offline
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(target)
    assert not broken, f"{page.name}: links to nothing: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_python_modules_named_exist(page: Path) -> None:
    modules = set(re.findall(r"python -m ([\w.]+)", page.read_text())) - {"pip", "pytest"}
    missing = sorted(m for m in modules if importlib.util.find_spec(m) is None)
    assert not missing, f"{page.name}: python -m of modules that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_serve_commands_parse(page: Path) -> None:
    for line in _commands(page):
        if not re.match(r"(trtllm-gateway|python -m gateway) serve\b", line):
            continue
        argv = shlex.split(line, comments=True)
        argv = argv[argv.index("serve") + 1:]
        try:
            build_parser().parse_args(["serve", *argv])
        except SystemExit:
            pytest.fail(f"{page.name}: `{line}` does not parse")


def test_readme_lines_fit_120_columns() -> None:
    long = [n for n, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1) if len(line) > 120]
    assert not long, f"README.md lines over 120 columns: {long}"
