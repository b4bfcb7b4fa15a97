"""Linear: a projection that may fuse several checkpoint projections (q/k/v, gate/up) into one matmul.

Each fused part keeps its checkpoint name and width (`parts`), so the loader can fill it and a LoRA
delta can be applied per part. `delta` is the seam for per-token low-rank updates: when set, the
layer's output is `delta(x, linear)`, which computes the projection itself (so it may fold more rows
into the same matmul, as the CUDA LoRA path does) and adds the updates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from runtime.models import int8

Delta = Callable[[torch.Tensor, "Linear"], torch.Tensor]


class Linear(nn.Module):
    """y = x W^T + b over packed tokens; `parts` names the output slices when checkpoints store them apart."""

    def __init__(
        self,
        in_features: int,
        parts: Sequence[tuple[str, int]],
        *,
        bias: bool = False,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.part_names: tuple[str, ...] = tuple(name for name, _ in parts)
        self.part_sizes: tuple[int, ...] = tuple(size for _, size in parts)
        self.out_features = sum(self.part_sizes)
        # empty, not initialised: every value is overwritten by the checkpoint
        self.weight = nn.Parameter(torch.empty(self.out_features, in_features, dtype=dtype), requires_grad=False)
        self.bias = (
            nn.Parameter(torch.empty(self.out_features, dtype=dtype), requires_grad=False) if bias else None
        )
        self.delta: Delta | None = None
        self.int8: int8.Int8Weight | None = None  # --cpu-quantization int8: used for batches of few rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delta is not None:
            return self.delta(x, self)
        if self.int8 is not None and x.shape[0] <= int8.MAX_ROWS:
            y = int8.matmul(x, self.int8)
            return y if self.bias is None else y + self.bias
        return F.linear(x, self.weight, self.bias)

    def part_range(self, part: str) -> tuple[int, int]:
        """(start, size) of a named part along the output dimension."""
        index = self.part_names.index(part)
        return sum(self.part_sizes[:index]), self.part_sizes[index]

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The output cut into its parts, in order."""
        return y.split(self.part_sizes, dim=-1)

    def load(self, attr: str, tensor: torch.Tensor, part: str | None) -> None:
        """Copy a checkpoint tensor into `weight`/`bias`, or into one part's rows of it."""
        param: torch.Tensor = getattr(self, attr)
        target = param.data
        if part is not None:
            start, size = self.part_range(part)
            target = target.narrow(0, start, size)
        if target.shape != tensor.shape:
            raise ValueError(f"shape mismatch for {attr}[{part}]: checkpoint {tuple(tensor.shape)}, "
                             f"model {tuple(target.shape)}")
        target.copy_(tensor)
