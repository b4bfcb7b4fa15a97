"""BlockTables: every sequence's KV block table as one row of a numpy matrix, kept up to date by diffs.

A step's inputs need its sequences' block tables as one int32 matrix (padded to the widest). Built from the tables'
Python lists every step, that cost about 25 ns an int: 143 us of a 256-row decode step's 235 us of packing on the
2-core dev box (2026-11-27). The tables barely change between steps: a sequence gets a new block every `block_size`
tokens. So the BlockManager, the only writer of block tables, writes each change into the sequence's row here (a
whole table when one is attached or forked, one id when a block is appended or copied on write), and a step gathers
its rows with one numpy indexing (runtime/native/decode_rows.py, ModelRunner.prepare).

A row belongs to a sequence from its first block until it frees them (Sequence.table_row; -1: none). Entries past
a row's table length are stale ids of earlier tables; readers never look past a sequence's length (as with the zero
padding of pad_block_tables). The matrix grows, by doubling, in rows and columns as sequences need them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from runtime.native.attention_metadata import pad_block_tables
from runtime.native.sequence import Sequence

if TYPE_CHECKING:
    from runtime.native.step_inputs import StepInputs


def step_tables(inputs: StepInputs, resident: BlockTables | None) -> np.ndarray:
    """The inputs' block tables, int32 [inputs, widest]: their rows of `resident` where every input names one (entries
    past a table's length: stale ids), else built from their lists (padded with 0)."""
    rows = inputs.table_rows
    if resident is None or min(rows) < 0:
        return pad_block_tables(inputs.block_tables).numpy()
    return resident.matrix[rows, : resident.lengths[rows].max()]


class BlockTables:
    """Block tables of the sequences holding blocks, one row each (see the module docstring)."""

    def __init__(self, rows: int = 64, width: int = 16) -> None:
        self.matrix = np.zeros((rows, width), dtype=np.int32)
        self.lengths = np.zeros(rows, dtype=np.int64)  # each row's table length (a step's width: their widest)
        self._free_rows = list(range(rows - 1, -1, -1))  # popped from the end: low rows first

    def write(self, seq: Sequence, start: int = 0) -> None:
        """Copy `seq.block_table[start:]` into its row (a row is given on the first write), and its length (a
        table cut to `start` entries: a write of nothing from there)."""
        if seq.table_row < 0:
            if not self._free_rows:
                self._grow(rows=2 * self.matrix.shape[0])
            seq.table_row = self._free_rows.pop()
        end = len(seq.block_table)
        if end > self.matrix.shape[1]:
            self._grow(width=max(end, 2 * self.matrix.shape[1]))
        if end > start:
            self.matrix[seq.table_row, start:end] = seq.block_table[start:]
        self.lengths[seq.table_row] = end

    def release(self, seq: Sequence) -> None:
        """`seq` holds no blocks any more: its row may go to another sequence."""
        if seq.table_row >= 0:
            self._free_rows.append(seq.table_row)
            self.lengths[seq.table_row] = 0
            seq.table_row = -1

    @property
    def rows_in_use(self) -> int:
        return self.matrix.shape[0] - len(self._free_rows)

    def row(self, seq: Sequence) -> list[int]:
        """`seq`'s table as held here (tests, invariants)."""
        return self.matrix[seq.table_row, : self.lengths[seq.table_row]].tolist() if seq.table_row >= 0 else []

    def _grow(self, rows: int | None = None, width: int | None = None) -> None:
        old = self.matrix
        self.matrix = np.zeros((rows or old.shape[0], width or old.shape[1]), dtype=np.int32)
        self.matrix[: old.shape[0], : old.shape[1]] = old
        if rows is not None:
            self.lengths = np.concatenate([self.lengths, np.zeros(rows - old.shape[0], dtype=np.int64)])
            self._free_rows[:0] = range(rows - 1, old.shape[0] - 1, -1)
