"""Decode-shaped rows: one row per new token, with everything a decode-shaped step reads of it.

Shared by the CUDA graphs (runtime/native/cuda/graphs.py) and the CPU's compiled decode steps
(runtime/native/cpu/compiled_decode.py): a row holds its token id, position, KV slot, the length of its sequence up
to and including it, its LoRA adapter slot, and, when the previous step sampled its token on the device (the
engine's async scheduling), that token's row in the previous step's samples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from runtime.native.block_tables import BlockTables, step_tables
from runtime.native.device import host_tensor

if TYPE_CHECKING:
    from runtime.native.step_inputs import StepInputs

MAX_ROWS_PER_SEQ = 17  # new tokens a sequence may bring to a graphed step (1 + the most draft tokens)
# rows of the packed input buffer; PREV: the row of the previous step's samples holding this row's token, or -1
IDS, POSITIONS, SLOTS, LENGTHS, ADAPTERS, PREV = range(6)
PACKED_ROWS = 6
PADDING = (0, 0, -1, 0, -1, -1)  # what a padded graph row holds in each packed row


class DecodeOutput(NamedTuple):
    """A decode-shaped step's float32 logits, one row per new token; from a CUDA graph also each row's greedy id,
    on the device and in pinned host memory (runtime/native/cuda/graphs.py); from the CPU's C++ and compiled steps, and
    CUDA graphs built to keep them, also the final hidden states, one row per new token (what an EAGLE head reads)."""

    logits: torch.Tensor
    greedy: torch.Tensor | None = None
    greedy_host: torch.Tensor | None = None
    hidden: torch.Tensor | None = None


def fit_rows(inputs: StepInputs, max_blocks: int) -> bool:
    """Whether every input brings at most MAX_ROWS_PER_SEQ new tokens and a table of at most `max_blocks` blocks."""
    return max(inputs.counts) <= MAX_ROWS_PER_SEQ and max(map(len, inputs.block_tables)) <= max_blocks


def pack_rows(inputs: StepInputs, block_size: int,
              resident: BlockTables | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One graph row per new token: the packed buffer's columns, int64 [PACKED_ROWS, rows], and the rows' block tables,
    int32 [rows, the step's widest table]. Tables come from `resident` (the BlockManager's, runtime/native/block_tables.py)
    where every input names its row there, else from the inputs' lists."""
    counts = inputs.counts
    n = len(inputs.token_ids)
    columns = np.empty((PACKED_ROWS, n), dtype=np.int64)
    starts = np.array(inputs.start_pos, dtype=np.int64)
    columns[IDS] = inputs.token_ids
    if n == len(counts):  # a decode step: one token per input
        owner = None
        positions = starts
        columns[ADAPTERS] = inputs.adapter_slots
        columns[PREV] = inputs.prev_samples
    else:
        owner = np.repeat(np.arange(len(counts)), counts)  # the input of each row
        first = np.array(inputs.first_rows(), dtype=np.int64)
        positions = starts[owner] + np.arange(n) - first[owner]
        columns[ADAPTERS] = np.array(inputs.adapter_slots)[owner]
        columns[PREV] = -1
        columns[PREV, first] = inputs.prev_samples  # only an input's first token can be pending
    columns[POSITIONS] = positions
    columns[LENGTHS] = positions + 1  # the row attends over its sequence up to and including itself
    tables = step_tables(inputs, resident)
    if owner is not None:
        tables = tables[owner]
    columns[SLOTS] = tables[np.arange(n), positions // block_size] * block_size + positions % block_size
    return columns, tables


def fill_pending(inputs: StepInputs, input_ids: torch.Tensor, last_sampled: torch.Tensor | None) -> None:
    """Write into `input_ids` (one row per new token) the tokens that the previous launch sampled on the device
    (`last_sampled`) for the inputs that name one (StepInput.prev_sample)."""
    if max(inputs.prev_samples) < 0:
        return
    dst = [row for row, prev in zip(inputs.first_rows(), inputs.prev_samples) if prev >= 0]
    src = [prev for prev in inputs.prev_samples if prev >= 0]
    assert last_sampled is not None, "a step named pending tokens but the previous one sampled none"
    if dst == src == list(range(len(dst))):  # the same rows in the same order: one copy, no index uploads
        input_ids[: len(dst)].copy_(last_sampled[: len(dst)])
        return
    device = input_ids.device
    input_ids.index_copy_(0, host_tensor(dst, torch.long, device), last_sampled[host_tensor(src, torch.long, device)])
