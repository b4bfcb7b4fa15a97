"""Test helpers: put the fake `tensorrt_llm` (tests/fakes/tensorrt_llm) on sys.path, or hide it.

`fake_trtllm` yields the imported fake package and removes every `tensorrt_llm*` module afterwards, so
a later test that expects TensorRT-LLM to be missing sees it missing.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

FAKES = Path(__file__).resolve().parent
SNAPSHOT = FAKES / "trtllm_api_snapshot.json"


def load_snapshot() -> dict[str, Any]:
    with open(SNAPSHOT, encoding="utf-8") as f:
        return json.load(f)


def _purge() -> None:
    for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        del sys.modules[name]


@pytest.fixture
def fake_trtllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The fake tensorrt_llm, importable for the duration of one test."""
    _purge()
    monkeypatch.syspath_prepend(str(FAKES))
    import tensorrt_llm

    yield tensorrt_llm
    _purge()
