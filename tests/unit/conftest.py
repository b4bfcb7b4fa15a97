"""Fixtures several unit test modules share."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.tokenizer import Tokenizer
from tests.tiny_models import build_tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """The tiny byte-level BPE tokenizer of tests/tiny_models.py."""
    folder = tmp_path_factory.mktemp("tok")
    build_tiny_tokenizer(Path(folder))
    return Tokenizer.from_pretrained(str(folder))
