"""The tensor-parallel group of this process: its rank, the group's size, and the collectives the layers call.

Model code asks `current()` for its share when it is built: column-parallel projections keep `share` of their output
rows, row-parallel ones of their input columns (their partial outputs summed by `all_reduce`), the vocabulary is
split in `vocab_share`s (logits put back together by `gather_vocab`). A process outside tensor parallelism is rank 0
of 1, where every share is the whole and every collective a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    size: int = 1
    group: Any = None  # the process group of the collectives (NCCL on CUDA, gloo on CPU)

    def share(self, total: int, what: str) -> tuple[int, int]:
        """(start, size) of this rank's equal share of `total` rows; ValueError when they do not divide evenly."""
        if total % self.size:
            raise ValueError(f"{what} ({total}) do not divide by --tensor-parallel-size {self.size}")
        size = total // self.size
        return self.rank * size, size

    def kv_heads(self, num_kv_heads: int) -> tuple[int, int]:
        """(first, count) of the KV heads this rank's query heads read: an equal share, or with fewer KV heads than
        ranks the one KV head of its query heads (replicated on several ranks)."""
        if num_kv_heads >= self.size:
            return self.share(num_kv_heads, "KV heads")
        if self.size % num_kv_heads:
            raise ValueError(f"--tensor-parallel-size {self.size} is not a multiple of the {num_kv_heads} KV heads")
        return self.rank * num_kv_heads // self.size, 1

    def vocab_share(self, vocab: int) -> tuple[int, int, int]:
        """(start, rows read, rows held) of this rank's slice of the vocabulary: every rank holds ceil(vocab / size)
        rows, the last ones zero past the vocabulary's end (their logits are cut off by gather_vocab)."""
        held = -(-vocab // self.size)
        start = min(self.rank * held, vocab)
        return start, min(held, vocab - start), held

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's `x`, in place (the partial outputs of a row-parallel projection)."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def gather_vocab(self, logits: torch.Tensor, vocab: int) -> torch.Tensor:
        """Every rank's logits [N, held] side by side, cut to [N, vocab] (all ranks get them; rank 0 samples)."""
        if self.size == 1:
            return logits
        parts = torch.empty((self.size, *logits.shape), dtype=logits.dtype, device=logits.device)
        if logits.is_cuda:
            dist.all_gather_into_tensor(parts, logits.contiguous(), group=self.group)
        else:  # gloo has no all_gather_into_tensor
            dist.all_gather(list(parts.unbind(0)), logits.contiguous(), group=self.group)
        return parts.permute(1, 0, 2).reshape(logits.shape[0], -1)[:, :vocab]


_current = TensorParallel()


def current() -> TensorParallel:
    """This process's tensor-parallel group (rank 0 of 1 unless `use` set one)."""
    return _current


def use(tp: TensorParallel) -> None:
    """Make `tp` the group that models built from now on split themselves over."""
    global _current
    _current = tp
