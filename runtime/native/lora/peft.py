"""Read a PEFT LoRA folder (adapter_config.json + adapter_model.safetensors) into LoraWeights: the config's
reading, scaling and refusals are runtime/peft_config.py's; this module reads and scales the weights."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from runtime.errors import InvalidRequestError
from runtime.peft_config import bad_adapter, read_peft_config
from runtime.native.lora.targets import LoraTargets
from runtime.native.lora.weights import LoraPair, LoraWeights

_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[A-Za-z0-9_-]+)?\.weight$")


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    st = path / "adapter_model.safetensors"
    if st.is_file():
        from safetensors.torch import load_file

        return load_file(str(st))
    pt = path / "adapter_model.bin"
    if pt.is_file():
        return torch.load(str(pt), map_location="cpu", weights_only=True)
    raise bad_adapter(path, "no adapter_model.safetensors (or adapter_model.bin)")


def load_peft_adapter(path: str | Path, targets: LoraTargets, max_rank: int,
                      dtype: torch.dtype = torch.float32) -> LoraWeights:
    """Read, check and scale a PEFT LoRA adapter for the model behind `targets`."""
    path = Path(path)
    cfg = read_peft_config(path, max_rank)
    try:
        tensors = _read_tensors(path)
    except InvalidRequestError:
        raise
    except Exception as exc:  # noqa: BLE001 - a corrupt file is the client's problem, said plainly
        raise bad_adapter(path, f"cannot read the weights: {exc}") from None
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        m = _KEY.match(key)
        if m is None:
            raise bad_adapter(path, f"unsupported tensor '{key}' (only lora_A/lora_B weights of Linear layers)")
        pairs.setdefault(m["module"], {})[m["ab"]] = tensor
    weights = LoraWeights()
    for peft_module, ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise bad_adapter(path, f"'{peft_module}' has lora_{''.join(ab)} but not both lora_A and lora_B")
        module, start, size = targets.resolve_peft(peft_module)
        a, b = ab["A"].float(), ab["B"].float()
        rank = a.shape[0]
        linear = targets.modules[module]
        if a.dim() != 2 or b.shape != (size, rank) or a.shape[1] != linear.full_in_features:
            raise bad_adapter(path, f"'{peft_module}': lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)} do not fit a "
                             f"[{size} x {linear.full_in_features}] projection")
        if rank > max_rank:
            raise bad_adapter(path, f"'{peft_module}' has rank {rank}, more than --max-lora-rank ({max_rank})")
        scale = cfg.scaling(peft_module.removeprefix("base_model.model."), rank)
        weights.add(module, LoraPair(start, size, a.to(dtype).contiguous(), (b * scale).to(dtype).contiguous()))
    if not weights.modules:
        raise bad_adapter(path, "the adapter has no LoRA weights")
    return weights
