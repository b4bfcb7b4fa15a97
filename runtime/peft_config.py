"""A PEFT LoRA folder's adapter_config.json, read and checked without torch: both backends use it (the native
runtime's loader, runtime/native/lora/peft.py, and the TensorRT-LLM backend's adapter list, runtime/trtllm/lora.py).

Scaling follows PEFT: lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora; rank_pattern and alpha_pattern
override r and alpha per module (a pattern matches a module path's dotted suffix, as PEFT matches them). Features
that change the forward pass beyond y += s * B A x (DoRA, trained biases, modules_to_save, embedding adapters) are
refused with a message naming them.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.errors import InvalidRequestError

CONFIG_FILE = "adapter_config.json"


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


def bad_adapter(path: str | Path, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"LoRA adapter at '{path}': {message}", param="lora_path")


def read_peft_config(path: str | Path, max_rank: int) -> PeftConfig:
    """Parse and check `path`/adapter_config.json (cheap: no weights are read)."""
    file = Path(path) / CONFIG_FILE
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise bad_adapter(path, f"no {CONFIG_FILE} (expected a PEFT LoRA folder)") from None
    except (OSError, ValueError) as exc:
        raise bad_adapter(path, f"cannot read {CONFIG_FILE}: {exc}") from None
    if not isinstance(raw, dict):
        raise bad_adapter(path, f"{CONFIG_FILE} is not a JSON object")
    if str(raw.get("peft_type", "LORA")).upper() != "LORA":
        raise bad_adapter(path, f"peft_type {raw.get('peft_type')!r} is not LORA")
    for flag, what in (("use_dora", "DoRA"), ("modules_to_save", "modules_to_save"),
                       ("trainable_token_indices", "trainable_token_indices")):
        if raw.get(flag):
            raise bad_adapter(path, f"{what} is not supported")
    if raw.get("bias", "none") != "none" or raw.get("lora_bias"):
        raise bad_adapter(path, "trained LoRA biases are not supported (bias must be 'none')")
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
        raise bad_adapter(path, f"bad {CONFIG_FILE}: {exc!r}") from None
    if cfg.r < 1:
        raise bad_adapter(path, f"rank r={cfg.r} must be at least 1")
    if cfg.max_rank > max_rank:
        raise bad_adapter(path, f"rank {cfg.max_rank} exceeds --max-lora-rank ({max_rank})")
    return cfg
