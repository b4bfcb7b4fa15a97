"""AttentionMetadata: how one packed step's tokens map onto the paged KV cache.

The model runner builds it (runtime/native/model_runner.py); the attention layer reads it
(runtime/native/models/attention.py). This is the only contract between scheduling and model code.

A step packs B sequences' new tokens back to back: sequence b contributes `query_lens[b]` tokens
(a whole prompt, a prefill chunk, one decode token, or K+1 speculative tokens) whose positions are
`context_lens[b] .. seq_lens[b]-1`. Each new token's K/V is written to `slot_mapping[t]`
(= block_id * block_size + offset) before attention; every new token then attends causally to all
of its sequence's cached tokens up to and including itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
import torch


@dataclass
class AttentionMetadata:
    query_start_loc: torch.Tensor  # int32 [B+1], cumulative new-token counts
    context_lens: torch.Tensor  # int32 [B], tokens already cached before this step
    seq_lens: torch.Tensor  # int32 [B], context_lens + query lens
    block_tables: torch.Tensor  # int32 [B, max_blocks_per_seq], padded with 0
    slot_mapping: torch.Tensor  # int64 [T], cache slot of each new token
    block_size: int
    max_query_len: int  # host-side copies, so kernels need no device sync
    max_seq_len: int
    query_lens_host: list[int]
    seq_lens_host: list[int]
    # tensors a backend derives from the fields above once per step and reuses in every layer
    # (so a metadata object whose tensors are refilled in place must not carry any)
    derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # a mixed step (runtime/native/cuda/mixed_graphs.py): its first rows are decode-shaped, each a one-token "sequence"
    # that `decode` describes; the fields above describe the sequences of the rows after them
    decode: AttentionMetadata | None = field(default=None, repr=False, compare=False)

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens_host)

    @property
    def decode_rows(self) -> int:
        """A mixed step's decode-shaped rows, which come first (0: none)."""
        return 0 if self.decode is None else self.decode.slot_mapping.shape[0]

    def step_slots(self) -> torch.Tensor:
        """The cache slot of every new token of the step: a mixed step's decode rows' then the rest's (joined once
        per step)."""
        if self.decode is None:
            return self.slot_mapping
        if "step_slots" not in self.derived:
            self.derived["step_slots"] = torch.cat((self.decode.slot_mapping, self.slot_mapping))
        return self.derived["step_slots"]

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


def pad_block_tables(tables: Sequence[list[int]]) -> torch.Tensor:
    """int32 [len(tables), widest table] on the host, each row padded with 0 (one numpy fill: copying a
    nested list into a tensor costs about 3x as much at 256 rows)."""
    lengths = np.fromiter(map(len, tables), dtype=np.int64, count=len(tables))
    out = np.zeros((len(tables), int(lengths.max())), dtype=np.int32)
    out[np.arange(out.shape[1]) < lengths[:, None]] = list(chain.from_iterable(tables))
    return torch.from_numpy(out)
