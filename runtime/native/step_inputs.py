"""A step's inputs: StepInput (one sequence's share) and StepInputs (the step's inputs as columns).

The engine builds a step's inputs straight into StepInputs' columns, one append per column and sequence: a
256-row decode step then makes no object per row (a StepInput each, and a list of its new tokens, were a sixth of
the engine core's step thread on the H200). The model runner's steady-state paths (decode graphs, the CPU's
compiled and eager steps) read the columns. StepInputs is also a sequence of StepInput, each made when read: the
rarer paths (prompts replayed from prefill graphs, tests) read rows; `StepInputs.of(rows)` turns rows into columns
(tests, the draft model, a step whose inputs speculation extends with drafts).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from runtime.native.row_view import RowView
from runtime.native.sampler import SamplingRow

NO_SAMPLES: list[SamplingRow] = []  # the sample rows of every input that samples nothing (never written to)


@dataclass(slots=True)
class StepInput:
    """One sequence's share of a step."""

    token_ids: list[int]  # the new tokens computed this step
    start_pos: int  # position of token_ids[0] = tokens already in the cache
    block_table: list[int]  # covers positions 0 .. start_pos + len(token_ids) - 1
    # Rows sampled from the last new token's logits: none mid-prompt, one normally, n when forking.
    sample_rows: list[SamplingRow] = field(default_factory=list)
    return_all_logits: bool = False  # logits of every new token (prompt logprobs, context logits)
    return_sample_logits: bool = False  # the raw logits the sampled rows came from (generation logits)
    adapter_slot: int = -1  # LoRA device slot of the sequence's adapter; -1: the base model
    table_row: int = -1  # block_table's row in the runner's resident block tables (runtime/native/block_tables.py); -1: none
    # keep all_logits / sample_logits on the device (speculative verification and drafting read them
    # there and copy back only the chosen ids)
    logits_on_device: bool = False
    # >= 0: token_ids is [PENDING_TOKEN]; the token is row `prev_sample` of the previous launch's sampled ids
    prev_sample: int = -1
    # the raw argmax of every new token's logits comes back in StepResult.row_argmax (with return_all_logits):
    # what a greedy target's speculative verification compares, taken for the whole step at once
    return_row_argmax: bool = False


class StepInputs(RowView[StepInput]):
    """One step's inputs as columns, in the order of the step's sequences (see the module docstring). The flags
    that are off for almost every input are kept as the set of inputs that have them on."""

    __slots__ = (
        "_first",
        "adapter_slots",
        "all_logits",
        "block_tables",
        "counts",
        "on_device",
        "prev_samples",
        "row_argmax",
        "sample_logits",
        "sample_rows",
        "start_pos",
        "table_rows",
        "token_ids",
    )

    def __init__(self) -> None:
        self.token_ids: list[int] = []  # every input's new tokens, in order
        self.counts: list[int] = []  # new tokens of each input
        self.start_pos: list[int] = []
        self.block_tables: list[list[int]] = []
        self.table_rows: list[int] = []
        self.sample_rows: list[list[SamplingRow]] = []
        self.adapter_slots: list[int] = []
        self.prev_samples: list[int] = []
        self.all_logits: set[int] = set()  # StepInput.return_all_logits
        self.sample_logits: set[int] = set()  # return_sample_logits
        self.on_device: set[int] = set()  # logits_on_device
        self.row_argmax: set[int] = set()  # return_row_argmax
        self._first: list[int] | None = None

    @classmethod
    def of(cls, rows: Iterable[StepInput]) -> StepInputs:
        if isinstance(rows, StepInputs):
            return rows
        inputs = cls()
        for inp in rows:
            b = len(inputs.counts)
            inputs.add(inp.token_ids, 0, len(inp.token_ids), inp.start_pos, inp.block_table, inp.table_row,
                       inp.sample_rows, inp.prev_sample, inp.adapter_slot)
            for flag, on in ((inputs.all_logits, inp.return_all_logits),
                             (inputs.sample_logits, inp.return_sample_logits),
                             (inputs.on_device, inp.logits_on_device), (inputs.row_argmax, inp.return_row_argmax)):
                if on:
                    flag.add(b)
        return inputs

    def add(self, tokens: list[int], first: int, count: int, start_pos: int, block_table: list[int],
            table_row: int = -1, sample_rows: list[SamplingRow] = NO_SAMPLES, prev_sample: int = -1,
            adapter_slot: int = -1) -> None:
        """Append one input whose `count` new tokens are `tokens[first : first + count]` (a sequence's: no list is
        cut for a decode's one token), at positions from `start_pos`. Its flags, when any is on, go into the sets by
        its index."""
        if count == 1:
            self.token_ids.append(tokens[first])
        else:
            self.token_ids += tokens[first : first + count]
        self.counts.append(count)
        self.start_pos.append(start_pos)
        self.block_tables.append(block_table)
        self.table_rows.append(table_row)
        self.sample_rows.append(sample_rows)
        self.prev_samples.append(prev_sample)
        self.adapter_slots.append(adapter_slot)
        self._first = None

    def first_rows(self) -> list[int]:
        """Each input's first new token's index in `token_ids`."""
        if self._first is None:
            self._first = list(accumulate(self.counts, initial=0))[:-1]
        return self._first

    def select(self, indices: Sequence[int]) -> StepInputs:
        """The inputs at `indices` (ascending), as a StepInputs of their own: sliced column by column where they are
        consecutive (the decode rows of a step that prompts join come first), else made from their rows."""
        if not indices or indices[-1] - indices[0] + 1 != len(indices):
            return StepInputs.of(self[b] for b in indices)
        start, stop = indices[0], indices[-1] + 1
        first = self.first_rows()
        out = StepInputs()
        out.token_ids = self.token_ids[first[start] : first[stop - 1] + self.counts[stop - 1]]
        for name in ("counts", "start_pos", "block_tables", "table_rows", "sample_rows", "adapter_slots",
                     "prev_samples"):
            setattr(out, name, getattr(self, name)[start:stop])
        for name in ("all_logits", "sample_logits", "on_device", "row_argmax"):
            setattr(out, name, {b - start for b in getattr(self, name) if start <= b < stop})
        return out

    def __len__(self) -> int:
        return len(self.counts)

    def _row(self, b: int) -> StepInput:
        first = self.first_rows()[b]
        return StepInput(self.token_ids[first : first + self.counts[b]], self.start_pos[b], self.block_tables[b],
                         self.sample_rows[b], b in self.all_logits, b in self.sample_logits, self.adapter_slots[b],
                         self.table_rows[b], b in self.on_device, self.prev_samples[b], b in self.row_argmax)
