"""Token and position embedding tables."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Embedding(nn.Module):
    """A lookup table [num_embeddings, dim]; also serves as the tied output projection."""

    def __init__(self, num_embeddings: int, dim: int, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, dim, dtype=dtype), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)
