"""Token and position embedding tables; vocabulary-parallel under tensor parallelism."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.native.parallel.group import current


class Embedding(nn.Module):
    """A lookup table [num_embeddings, dim]; also serves as the tied output projection.

    Under tensor parallelism each rank holds a slice of the rows (TensorParallel.vocab_share); a token outside it
    looks up zeros, and the ranks' lookups are summed."""

    def __init__(self, num_embeddings: int, dim: int, *, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.start, self.rows_read, held = current().vocab_share(num_embeddings)
        self.weight = nn.Parameter(torch.empty(held, dim, dtype=dtype), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        tp = current()
        if tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        outside = (local < 0) | (local >= self.rows_read)
        x = F.embedding(local.masked_fill(outside, 0), self.weight).masked_fill(outside[:, None], 0)
        return tp.all_reduce(x)

    def load(self, attr: str, tensor: torch.Tensor, part: str | None) -> None:
        """Copy this rank's rows of the checkpoint's table (the rest, past the vocabulary, zero)."""
        target = self.weight.data
        if tensor.shape != (self.num_embeddings, target.shape[1]):
            raise ValueError(f"shape mismatch for embedding {attr}: checkpoint {tuple(tensor.shape)}, model "
                             f"{tuple(target.shape)}")
        target.zero_()
        target[: self.rows_read].copy_(tensor.narrow(0, self.start, self.rows_read))
