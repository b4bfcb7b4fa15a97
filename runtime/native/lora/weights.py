"""LoraWeights: one adapter's low-rank pairs, keyed by the model module they update.

Whatever the source (a PEFT folder, TensorRT-LLM's lora_weights/lora_config tensors), an adapter ends
up as, per target Linear, a list of (output rows, A, B) with the adapter's scaling already folded into
B, so applying it is y[:, rows] += x A^T B^T and nothing else. Under tensor parallelism the pairs stay whole (rows of
the checkpoint's projection) until a rank places them: `local_pair` is its share, split like the base weight.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from runtime.native.models.linear import Linear


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


def local_pair(linear: Linear, pair: LoraPair) -> LoraPair:
    """This rank's share of a pair on a tensor-parallel `linear`: column-parallel, the rows of B that the rank's
    slices of the parts hold (rows between them zero); row-parallel, the rank's input columns of A (each rank's
    x A^T B^T is then a partial sum, added up by the Linear's all-reduce). The pair itself outside tensor parallelism."""
    shard = linear.shard
    if shard is None:
        return pair
    if shard.cols is not None:
        return LoraPair(pair.start, pair.size, pair.a[:, shard.cols[0] : sum(shard.cols)].contiguous(), pair.b)
    segments = []  # (local row, row of the pair's B, count)
    full_start = local_start = 0
    for (first, count), full, size in zip(shard.rows, shard.full_rows, linear.part_sizes):
        lo, hi = max(pair.start, full_start + first), min(pair.start + pair.size, full_start + first + count)
        if lo < hi:
            segments.append((local_start + lo - full_start - first, lo - pair.start, hi - lo))
        full_start, local_start = full_start + full, local_start + size
    start = min(row for row, _, _ in segments)
    end = max(row + count for row, _, count in segments)
    b = pair.b.new_zeros(end - start, pair.rank)
    for row, source, count in segments:
        b[row - start : row - start + count] = pair.b[source : source + count]
    return LoraPair(start, end - start, pair.a, b)
