"""KServe v2 metadata documents: server metadata, model metadata, model configuration, readiness.

Inputs and outputs come from the tables in inputs.py (the same ones requests are parsed with), so
what `GET /v2/models/{m}` advertises is exactly what `generate` accepts. Shapes carry the batch
dimension first (-1), as Triton reports them for models with max_batch_size > 0.
"""

from __future__ import annotations

from importlib import metadata as _pkg_metadata
from collections.abc import Iterable
from typing import Any

from adapters.triton.generate import IDS_MODEL_NAME, TEXT_MODEL_NAMES
from adapters.triton.inputs import ModelKind, input_specs, output_specs
from adapters.triton.tokenizer_models import TOKENIZER_MODELS
from adapters.triton.model_repo import PARAMETER_FIELDS
from runtime.config import EngineConfig

SERVER_NAME = "trtllm-gateway"
# KServe extensions we implement: model configuration (GET .../config), Triton's generate, the repository
# index (POST /v2/repository/index) and statistics (GET /v2/models[/{m}]/stats).
EXTENSIONS = ("model_configuration", "generate", "model_repository", "statistics")


def server_version() -> str:
    try:
        return _pkg_metadata.version("trtllm-gateway")
    except _pkg_metadata.PackageNotFoundError:  # running from a source tree
        return "0.1.0"


def server_metadata() -> dict[str, Any]:
    """GET /v2."""
    return {"name": SERVER_NAME, "version": server_version(), "extensions": list(EXTENSIONS)}


def model_names(served_model_name: str, adapters: Iterable[str] = ()) -> list[str]:
    """Every model name the Triton dialect answers to: the served name first, the backend's models, the
    served LoRA adapters."""
    names = [served_model_name, *TEXT_MODEL_NAMES, IDS_MODEL_NAME, *TOKENIZER_MODELS, *adapters]
    return list(dict.fromkeys(names))


def repository_index(names: list[str], ready: bool) -> list[dict[str, str]]:
    """POST /v2/repository/index: every model (`names`, from model_names), its version and state."""
    state = "READY" if ready else "UNAVAILABLE"
    return [{"name": name, "version": "1", "state": state} for name in names]


def _platform(name: str, kind: ModelKind) -> tuple[str, str]:
    """(platform, backend) as Triton reports them for the backend's models."""
    if kind == "ids":
        return "tensorrtllm", "tensorrtllm"
    if name == "tensorrt_llm_bls" or kind in TOKENIZER_MODELS:
        return "python", "python"
    return "ensemble", ""


def model_metadata(name: str, kind: ModelKind, version: str = "1") -> dict[str, Any]:
    """GET /v2/models/{name}[/versions/{version}]."""
    return {
        "name": name,
        "versions": [version],
        "platform": _platform(name, kind)[0],
        "inputs": [
            {"name": s.name, "datatype": s.datatype, "shape": [-1, *s.dims]}
            for s in input_specs(kind)
            if s.supported
        ],
        "outputs": [{"name": n, "datatype": dt, "shape": [-1, *dims]} for n, dt, dims in output_specs(kind)],
    }


def _config_type(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else "TYPE_" + datatype


def _parameter_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _backend_parameters(engine: EngineConfig, exclude_input_in_output: bool) -> dict[str, dict[str, str]]:
    """The tensorrt_llm model's parameters, written back from the engine settings in use."""
    out: dict[str, dict[str, str]] = {}
    seen: set[str] = set()
    for param, (field_name, _) in PARAMETER_FIELDS.items():
        if field_name in seen or field_name == "max_batch_size":  # max_batch_size is top-level
            continue
        seen.add(field_name)
        value = getattr(engine, field_name)
        if field_name == "device":
            if not str(value).startswith("cuda:"):
                continue
            value = str(value).split(":", 1)[1]
        if value is None:
            continue
        out[param] = {"string_value": _parameter_text(value)}
    out["exclude_input_in_output"] = {"string_value": _parameter_text(exclude_input_in_output)}
    return out


def model_config(
    name: str, kind: ModelKind, engine: EngineConfig, *, exclude_input_in_output: bool = False
) -> dict[str, Any]:
    """GET /v2/models/{name}/config: a JSON model configuration shaped like the backend's config.pbtxt."""
    platform, backend = _platform(name, kind)
    config: dict[str, Any] = {"name": name, "platform": platform, "backend": backend,
                              "max_batch_size": engine.max_batch_size}
    config["input"] = [
        {"name": s.name, "data_type": _config_type(s.datatype), "dims": list(s.dims), "optional": not s.required}
        for s in input_specs(kind)
        if s.supported
    ]
    config["output"] = [{"name": n, "data_type": _config_type(dt), "dims": list(dims)}
                        for n, dt, dims in output_specs(kind)]
    # Every generating model streams over generate_stream, like the backend's decoupled mode.
    config["model_transaction_policy"] = {"decoupled": kind not in TOKENIZER_MODELS}
    config["parameters"] = _backend_parameters(engine, exclude_input_in_output) if kind == "ids" else {}
    return config


def model_ready(ready: bool, name: str) -> dict[str, Any]:
    """Body of GET /v2/models/{name}/ready (the status code carries the answer; the body helps curl)."""
    return {"name": name, "ready": ready}
