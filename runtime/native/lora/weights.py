"""LoraWeights: one adapter's low-rank pairs, keyed by the model module they update.

Whatever the source (a PEFT folder, TensorRT-LLM's lora_weights/lora_config tensors), an adapter ends
up as, per target Linear, a list of (output rows, A, B) with the adapter's scaling already folded into
B, so applying it is y[:, rows] += x A^T B^T and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class LoraPair:
    """A [r, in] and B [size, r] (scaled) updating output rows start .. start + size of one Linear."""

    start: int
    size: int
    a: torch.Tensor
    b: torch.Tensor

    @property
    def rank(self) -> int:
        return int(self.a.shape[0])


@dataclass
class LoraWeights:
    """An adapter's weights in host memory: our module name -> its pairs."""

    modules: dict[str, list[LoraPair]] = field(default_factory=dict)

    def add(self, module: str, pair: LoraPair) -> None:
        self.modules.setdefault(module, []).append(pair)

    @property
    def rank(self) -> int:
        """The largest rank of any pair (0 when empty)."""
        return max((p.rank for pairs in self.modules.values() for p in pairs), default=0)

    @property
    def nbytes(self) -> int:
        return sum(p.a.numel() * p.a.element_size() + p.b.numel() * p.b.element_size()
                   for pairs in self.modules.values() for p in pairs)
