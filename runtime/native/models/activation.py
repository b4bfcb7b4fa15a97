"""Activation functions by their HF config names (runtime/architectures.py says which name is which)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from runtime.architectures import activation_kind

_FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
}


def get_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation for a config's `hidden_act` / `activation_function` (ValueError for one we do not implement)."""
    return _FUNCTIONS[activation_kind(name)]
