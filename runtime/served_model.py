"""The served model as a front end knows it, read from config.json without torch: the checkpoint folder, its
ModelSpec and the ModelInfo the gateway is told. The engine core adds the device and dtype it resolves
(runtime/native/core_loader.py), which reach the front end in its Ready message.

A GGUF file not converted before is converted first in a process of its own (`python -m runtime.native.models.gguf`):
the conversion needs torch, which the front end never loads.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from runtime.architectures import check_supported
from runtime.config import EngineConfig
from runtime.default_model import gguf_to_convert, resolve_model
from runtime.engine import ModelInfo
from runtime.model_spec import ModelSpec


@dataclass(frozen=True)
class ServedModel:
    """The checkpoint to serve, known before any weight is read."""

    path: str
    spec: ModelSpec
    info: ModelInfo  # without device and dtype, which the engine core resolves


def describe_served_model(config: EngineConfig) -> ServedModel:
    """What `config` serves; ValueError names what we do not serve (in one line, before any weight is read)."""
    model_path, default_name = resolve_model(config.model, config.dtype)
    spec = ModelSpec.from_pretrained(model_path)
    check_supported(spec)
    window = config.max_model_len or spec.max_position_embeddings
    if window > spec.max_position_embeddings:
        raise ValueError(
            f"max_model_len {window} exceeds the model's max_position_embeddings ({spec.max_position_embeddings})"
        )
    info = ModelInfo(name=config.served_model_name or default_name, context_window=window,
                     vocab_size=spec.vocab_size, backend="native")
    return ServedModel(model_path, spec, info)


def builds_cpu_kernels(config: EngineConfig) -> bool:
    """Whether a GGUF conversion also builds the CPU kernels that the engine core builds next (where no GPU serves):
    beside it, a first start pays for the two at once (65 -> 45 s on the 2-core box)."""
    return config.cpu_compile and config.device in ("auto", "cpu")


def convert_apart(config: EngineConfig) -> None:
    """Convert the GGUF file `config` serves, unless converted before, in a child process (tens of seconds);
    ValueError with the child's last line when it fails."""
    if gguf_to_convert(config.model, config.dtype) is None:
        return
    from runtime.default_model import default_model_file

    source = str(default_model_file()) if config.model is None else config.model
    kernels = ["--build-cpu-kernels"] if builds_cpu_kernels(config) else []
    child = subprocess.Popen([sys.executable, "-m", "runtime.native.models.gguf", source, "--dtype", config.dtype,
                              *kernels],
                             env=with_our_packages(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
    assert child.stderr is not None
    last = ""
    for line in child.stderr:  # its progress and log lines go on to ours
        sys.stderr.write(line)
        last = line.strip() or last
    if child.wait() != 0:
        raise ValueError(last or f"converting {source} failed (exit code {child.returncode})")


def with_our_packages(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with the folder holding `runtime` first on PYTHONPATH (a child runs `-m runtime...` from whatever
    working directory its parent has)."""
    root = str(Path(__file__).resolve().parents[1])
    paths = [root, *filter(None, environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}
