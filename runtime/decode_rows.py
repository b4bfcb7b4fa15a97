"""Decode-shaped rows: one row per new token, with everything a decode-shaped step reads of it.

Shared by the CUDA graphs (runtime/cuda/graphs.py) and the CPU's compiled decode steps
(runtime/cpu/compiled_decode.py): a row holds its token id, position, KV slot, the length of its sequence up
to and including it, its LoRA adapter slot, and, when the previous step sampled its token on the device (the
engine's async scheduling), that token's row in the previous step's samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch

from runtime.attention_metadata import pad_block_tables
from runtime.device import host_tensor

if TYPE_CHECKING:
    from runtime.model_runner import StepInput

MAX_ROWS_PER_SEQ = 17  # new tokens a sequence may bring to a graphed step (1 + the most draft tokens)
# rows of the packed input buffer; PREV: the row of the previous step's samples holding this row's token, or -1
IDS, POSITIONS, SLOTS, LENGTHS, ADAPTERS, PREV = range(6)
PACKED_ROWS = 6
PADDING = (0, 0, -1, 0, -1, -1)  # what a padded graph row holds in each packed row


class DecodeOutput(NamedTuple):
    """A decode-shaped step's float32 logits, one row per new token; from a CUDA graph also each row's greedy id,
    on the device and in pinned host memory (runtime/cuda/graphs.py)."""

    logits: torch.Tensor
    greedy: torch.Tensor | None = None
    greedy_host: torch.Tensor | None = None


def pack_rows(inputs: Sequence[StepInput], block_size: int) -> tuple[list[list[int]], torch.Tensor]:
    """One graph row per new token: the packed buffer's columns as lists (PACKED_ROWS of them) and the rows'
    block tables, int32 padded to the step's widest."""
    columns: list[list[int]] = [[] for _ in range(PACKED_ROWS)]
    ids, positions, slots, lengths, adapters, prev = columns
    tables: list[list[int]] = []
    for inp in inputs:
        table = inp.block_table
        for j, token in enumerate(inp.token_ids):
            p = inp.start_pos + j
            ids.append(token)
            positions.append(p)
            slots.append(table[p // block_size] * block_size + p % block_size)
            lengths.append(p + 1)  # the row attends over its sequence up to and including itself
            adapters.append(inp.adapter_slot)
            prev.append(inp.prev_sample if j == 0 else -1)  # only an input's first token can be pending
            tables.append(table)
    return columns, pad_block_tables(tables)


def fill_pending(inputs: Sequence[StepInput], input_ids: torch.Tensor, last_sampled: torch.Tensor | None) -> None:
    """Write into `input_ids` (one row per new token) the tokens that the previous launch sampled on the device
    (`last_sampled`) for the inputs that name one (StepInput.prev_sample)."""
    dst: list[int] = []
    src: list[int] = []
    row = 0
    for inp in inputs:
        if inp.prev_sample >= 0:
            dst.append(row)
            src.append(inp.prev_sample)
        row += len(inp.token_ids)
    if not dst:
        return
    assert last_sampled is not None, "a step named pending tokens but the previous one sampled none"
    if dst == src == list(range(len(dst))):  # the same rows in the same order: one copy, no index uploads
        input_ids[: len(dst)].copy_(last_sampled[: len(dst)])
        return
    device = input_ids.device
    input_ids.index_copy_(0, host_tensor(dst, torch.long, device), last_sampled[host_tensor(src, torch.long, device)])
