"""load_model: build our model for an HF checkpoint folder and fill it from its safetensors files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors import safe_open
from tqdm.auto import tqdm

from runtime.architectures import UnsupportedArchitectureError, check_supported
from runtime.native.device import DTYPES
from runtime.model_spec import ModelSpec
from runtime.native.models.base import CausalLM
from runtime.native.models.embedding import Embedding
from runtime.native.models.fp8_checkpoint import Fp8Reader, checkpoint_is_fp8, quantize_model
from runtime.native.models.int4_checkpoint import Int4Reader, int4_config
from runtime.native.models.linear import Linear
from runtime.native.models.moe import Experts
from runtime.native.models.registry import model_class
from runtime.native.parallel.group import current

Quantization = Literal["none", "fp8"]


def load_model(path: str, dtype: torch.dtype | None = None, device: torch.device | str = "cpu",
               context_window: int | None = None, quantization: Quantization = "none",
               int4_kernels: bool = False) -> CausalLM:
    """Our CausalLM for the folder `path` (config.json + model.safetensors or sharded with an index).

    dtype None keeps the checkpoint's dtype (float32 if config.json names none). Tensors are
    converted and moved as they are copied in; a progress bar counts them. `context_window`: the served
    context (max_model_len), which picks LongRoPE's factors. FP8 checkpoints keep their FP8 weights where the
    device multiplies them (runtime/native/models/fp8_checkpoint.py); AWQ/GPTQ INT4 ones are dequantized at load
    unless `int4_kernels` keeps them packed on CUDA (int4_checkpoint.py); `quantization` "fp8" quantizes a 16-bit checkpoint's
    projections. Raises UnsupportedArchitectureError for architectures or options we do not implement.
    """
    folder = Path(path)
    spec = ModelSpec.from_pretrained(folder)
    spec.context_window = context_window or spec.context_window
    check_supported(spec)
    cls = model_class(spec.architecture)
    if current().size > 1 and not cls.tensor_parallel:
        raise UnsupportedArchitectureError(spec.architecture, "not split by --tensor-parallel-size yet")
    dtype = dtype or DTYPES[spec.dtype]
    try:
        # parameters are allocated empty on the target device; the checkpoint fills every one
        with torch.device(device):
            model = cls(spec, dtype)
    except ValueError as exc:  # an option of this config that we do not implement (rope type, activation, ...)
        raise UnsupportedArchitectureError(spec.architecture, str(exc)) from exc
    files = checkpoint_files(folder)
    try:
        int4 = int4_config(spec.config)
        reader: Fp8Reader | Int4Reader | None = (
            Fp8Reader(model, files, torch.device(device)) if checkpoint_is_fp8(folder, spec.config)
            else Int4Reader(model, int4, files, torch.device(device), int4_kernels) if int4 is not None else None)
    except ValueError as exc:  # a quantization scheme we do not read
        raise UnsupportedArchitectureError(spec.architecture, str(exc)) from exc
    # (a checkpoint of 16-bit weights with KV-cache scales only is split: the scales are per tensor, every rank's)
    quantized = isinstance(reader, Int4Reader) or isinstance(reader, Fp8Reader) and bool(reader.fp8_modules)
    if current().size > 1 and (quantized or quantization != "none"):
        raise UnsupportedArchitectureError(spec.architecture, "quantized weights are not split by "
                                           "--tensor-parallel-size yet")
    _fill(model, files, reader)
    if reader is None and quantization == "fp8":
        quantize_model(model)
    return model.eval()


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint: the shards named by the index, or the single file."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return [folder / name for name in sorted(set(weight_map.values()))]
    single = folder / "model.safetensors"
    if single.exists():
        return [single]
    found = sorted(folder.glob("*.safetensors"))
    if not found:
        raise FileNotFoundError(f"no safetensors weights in {folder} (expected model.safetensors or an index)")
    return found


def _fill(model: CausalLM, files: list[Path], quantized: Fp8Reader | Int4Reader | None) -> None:
    params = dict(model.named_parameters())
    loaded: dict[str, set[str | None]] = {name: set() for name in params}
    keys: list[tuple[Path, list[str]]] = []
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            keys.append((file, list(f.keys())))
    with tqdm(total=sum(len(k) for _, k in keys), desc="Loading weights", unit="tensor") as bar:
        for file, names in keys:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for name in names:
                    # a quantized weight and its scales come out together once all are read (fp8_checkpoint.py,
                    # int4_checkpoint.py)
                    ready = quantized.accept(name, f.get_tensor(name)) if quantized is not None and quantized.takes(
                        name) else [
                        (name, None)]
                    for ready_name, read in ready:
                        target = model.checkpoint_target(ready_name)
                        if target is None:
                            continue
                        param_name, part = target
                        if param_name not in params:
                            raise ValueError(f"checkpoint tensor {ready_name!r} in {file.name} matches no model "
                                             "parameter")
                        tensor = _read(model, f, name, param_name) if read is None else read
                        if not isinstance(tensor, LazyTensor):
                            tensor = model.convert_tensor(param_name, tensor)
                        if tensor is not None:  # None: held until what it combines with is read (gpt_oss.py)
                            _copy(model, param_name, part, tensor)
                            loaded[param_name].add(part)
                    bar.update(1)
    if quantized is not None:
        quantized.finish()  # (a quantized weight whose scales never came is named there)
    missing = [name for name, parts in loaded.items() if not _complete(model, name, parts)]
    if missing:
        raise ValueError(f"checkpoint is missing weights for: {', '.join(missing)}")


class LazyTensor:
    """A checkpoint tensor not read yet: `narrow` reads one slice of it from the file (a tensor-parallel rank's share
    of a weight: the rest is never read)."""

    def __init__(self, lazy: Any) -> None:  # safetensors' PySafeSlice
        self._lazy = lazy
        self.shape = torch.Size(lazy.get_shape())

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        index = [slice(None)] * len(self.shape)
        index[dim] = slice(start, start + length)
        return self._lazy[tuple(index)]


def _read(model: CausalLM, f: Any, name: str, param_name: str) -> torch.Tensor | LazyTensor:
    """The checkpoint tensor `name`; a LazyTensor where a tensor-parallel rank keeps a share of it as it is stored
    (a split weight of a model that does not convert it on load)."""
    module, attr = _owner(model, param_name)
    split = isinstance(module, Embedding) or isinstance(module, Linear) and module.shard is not None
    if attr == "weight" and split and current().size > 1 and type(model).convert_tensor is CausalLM.convert_tensor:
        return LazyTensor(f.get_slice(name))
    return f.get_tensor(name)


def _owner(model: CausalLM, param_name: str) -> tuple[torch.nn.Module, str]:
    module_name, _, attr = param_name.rpartition(".")
    return model.get_submodule(module_name), attr


def _complete(model: CausalLM, param_name: str, parts: set[str | None]) -> bool:
    """Whether the checkpoint filled the parameter: whole (fused in the checkpoint too: Phi-3's qkv_proj, stacked
    experts) or every part of it."""
    module, attr = _owner(model, param_name)
    if parts == {None}:
        return True
    if isinstance(module, Linear):
        return parts == set(module.part_names)
    if isinstance(module, Experts):
        return parts == module.expected_parts(attr)
    return False


def _copy(model: CausalLM, param_name: str, part: str | None, tensor: torch.Tensor | LazyTensor) -> None:
    module, attr = _owner(model, param_name)
    if isinstance(module, Linear | Experts | Embedding):
        module.load(attr, tensor, part)
        return
    tp_slice = getattr(module, "tp_slices", {}).get(attr)  # a rank's share of a per-head tensor
    if tp_slice is not None:
        tensor = tensor.narrow(*tp_slice)
    target = getattr(module, attr).data
    if target.shape != tensor.shape:
        raise ValueError(
            f"shape mismatch for {param_name}: checkpoint {tuple(tensor.shape)}, model {tuple(target.shape)}"
        )
    target.copy_(tensor)
