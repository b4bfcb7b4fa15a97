"""Read a PEFT LoRA folder (adapter_config.json + adapter_model.safetensors) into LoraWeights.

Scaling follows PEFT: lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora; rank_pattern and
alpha_pattern override r and alpha per module (a pattern matches a module path's dotted suffix, as PEFT
matches them). Features that change the forward pass beyond y += s * B A x (DoRA, trained biases,
modules_to_save, embedding adapters) are refused with a message naming them.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from runtime.errors import InvalidRequestError
from runtime.lora.targets import LoraTargets
from runtime.lora.weights import LoraPair, LoraWeights

CONFIG_FILE = "adapter_config.json"
_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[A-Za-z0-9_-]+)?\.weight$")


@dataclass
class PeftConfig:
    """The adapter_config.json fields that decide the math."""

    r: int
    lora_alpha: float
    use_rslora: bool = False
    target_modules: list[str] = field(default_factory=list)
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, float] = field(default_factory=dict)

    @property
    def max_rank(self) -> int:
        return max([self.r, *self.rank_pattern.values()])

    def scaling(self, module: str, rank: int) -> float:
        """PEFT's scaling for `module` (its path inside the model) with its actual rank."""
        alpha = _pattern_value(self.alpha_pattern, module, self.lora_alpha)
        return alpha / math.sqrt(rank) if self.use_rslora else alpha / rank


def _pattern_value(patterns: dict[str, Any], module: str, default: Any) -> Any:
    for pattern, value in patterns.items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            return value
    return default


def _bad(path: str | Path, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"LoRA adapter at '{path}': {message}", param="lora_path")


def read_peft_config(path: str | Path, max_rank: int) -> PeftConfig:
    """Parse and check `path`/adapter_config.json (cheap: no weights are read)."""
    file = Path(path) / CONFIG_FILE
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _bad(path, f"no {CONFIG_FILE} (expected a PEFT LoRA folder)") from None
    except (OSError, ValueError) as exc:
        raise _bad(path, f"cannot read {CONFIG_FILE}: {exc}") from None
    if not isinstance(raw, dict):
        raise _bad(path, f"{CONFIG_FILE} is not a JSON object")
    if str(raw.get("peft_type", "LORA")).upper() != "LORA":
        raise _bad(path, f"peft_type {raw.get('peft_type')!r} is not LORA")
    for flag, what in (("use_dora", "DoRA"), ("modules_to_save", "modules_to_save"),
                       ("trainable_token_indices", "trainable_token_indices")):
        if raw.get(flag):
            raise _bad(path, f"{what} is not supported")
    if raw.get("bias", "none") != "none" or raw.get("lora_bias"):
        raise _bad(path, "trained LoRA biases are not supported (bias must be 'none')")
    targets = raw.get("target_modules") or []
    try:
        cfg = PeftConfig(
            r=int(raw["r"]),
            lora_alpha=float(raw.get("lora_alpha", raw["r"])),
            use_rslora=bool(raw.get("use_rslora", False)),
            target_modules=[targets] if isinstance(targets, str) else list(targets),
            rank_pattern={str(k): int(v) for k, v in (raw.get("rank_pattern") or {}).items()},
            alpha_pattern={str(k): float(v) for k, v in (raw.get("alpha_pattern") or {}).items()},
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise _bad(path, f"bad {CONFIG_FILE}: {exc!r}") from None
    if cfg.r < 1:
        raise _bad(path, f"rank r={cfg.r} must be at least 1")
    if cfg.max_rank > max_rank:
        raise _bad(path, f"rank {cfg.max_rank} exceeds --max-lora-rank ({max_rank})")
    return cfg


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    st = path / "adapter_model.safetensors"
    if st.is_file():
        from safetensors.torch import load_file

        return load_file(str(st))
    pt = path / "adapter_model.bin"
    if pt.is_file():
        return torch.load(str(pt), map_location="cpu", weights_only=True)
    raise _bad(path, "no adapter_model.safetensors (or adapter_model.bin)")


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
        raise _bad(path, f"cannot read the weights: {exc}") from None
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        m = _KEY.match(key)
        if m is None:
            raise _bad(path, f"unsupported tensor '{key}' (only lora_A/lora_B weights of Linear layers)")
        pairs.setdefault(m["module"], {})[m["ab"]] = tensor
    weights = LoraWeights()
    for peft_module, ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise _bad(path, f"'{peft_module}' has lora_{''.join(ab)} but not both lora_A and lora_B")
        module, start, size = targets.resolve_peft(peft_module)
        a, b = ab["A"].float(), ab["B"].float()
        rank = a.shape[0]
        linear = targets.modules[module]
        if a.dim() != 2 or b.shape != (size, rank) or a.shape[1] != linear.in_features:
            raise _bad(path, f"'{peft_module}': lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)} do not fit a "
                             f"[{size} x {linear.in_features}] projection")
        if rank > max_rank:
            raise _bad(path, f"'{peft_module}' has rank {rank}, more than --max-lora-rank ({max_rank})")
        scale = cfg.scaling(peft_module.removeprefix("base_model.model."), rank)
        weights.add(module, LoraPair(start, size, a.to(dtype).contiguous(), (b * scale).to(dtype).contiguous()))
    if not weights.modules:
        raise _bad(path, "the adapter has no LoRA weights")
    return weights
