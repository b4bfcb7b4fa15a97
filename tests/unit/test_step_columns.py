"""A step as columns: StepInputs (runtime/native/step_inputs.py), StepResults (runtime/native/step_results.py) and the
scheduler's batch (runtime/native/scheduler.py) keep what per-row objects held, and give the same rows back."""

from __future__ import annotations

import torch

from runtime.request import SamplingOptions
from runtime.native.sampler import SamplingRow
from runtime.native.scheduler import ScheduledBatch
from runtime.native.sequence import Sequence, SequenceStatus
from runtime.native.step_inputs import StepInput, StepInputs
from runtime.native.step_results import StepResults


def _row() -> SamplingRow:
    return SamplingRow(SamplingOptions(max_tokens=4), [1], [], None, [0])


ROWS = [
    StepInput([5], 9, [0, 1, 2], [_row()], table_row=3, prev_sample=0),  # a decode whose token is pending
    StepInput([6, 7, 8], 4, [4, 5], [], return_all_logits=True, adapter_slot=1),  # a prompt chunk
    StepInput([9, 10], 2, [6], [_row(), _row()], return_sample_logits=True, logits_on_device=True,
              return_row_argmax=True),
]


def test_step_inputs_hold_the_rows_they_are_made_of() -> None:
    inputs = StepInputs.of(ROWS)
    assert list(inputs) == ROWS and inputs[-1] == ROWS[-1] and inputs[1:] == ROWS[1:]
    assert inputs.token_ids == [5, 6, 7, 8, 9, 10] and inputs.counts == [1, 3, 2] and inputs.first_rows() == [0, 1, 4]
    assert (inputs.all_logits, inputs.sample_logits, inputs.on_device, inputs.row_argmax) == ({1}, {2}, {2}, {2})
    assert StepInputs.of(inputs) is inputs


def test_a_selection_is_the_same_rows_sliced_or_not() -> None:
    inputs = StepInputs.of(ROWS)
    consecutive, scattered = inputs.select([1, 2]), inputs.select([0, 2])
    assert list(consecutive) == ROWS[1:] and list(scattered) == [ROWS[0], ROWS[2]]
    assert consecutive.token_ids == [6, 7, 8, 9, 10] and consecutive.all_logits == {0}
    assert consecutive.row_argmax == {1} and len(inputs.select([])) == 0


def test_an_engine_style_add_takes_the_new_tokens_from_the_sequence() -> None:
    inputs = StepInputs()
    sequence_tokens = [1, 2, 3, 4, 5]
    inputs.add(sequence_tokens, 4, 1, 4, [0, 1])  # a decode: the last token
    inputs.add(sequence_tokens, 1, 3, 1, [2])  # a chunk of three
    assert list(inputs) == [StepInput([5], 4, [0, 1]), StepInput([2, 3, 4], 1, [2])]


def test_results_read_as_columns_or_rows() -> None:
    # three inputs: one sample, none (a prompt chunk), two (a fork)
    logits = torch.ones(1, 4)
    results = StepResults([1, 0, 2], [11, 12, 13], [-0.5, -1.0, -1.5], None, None, {1: logits}, None, {2: [7, 8]})
    assert results.first_ids() == [11, None, 12]
    assert [r.token_ids for r in results] == [[11], (), [12, 13]]
    assert results[2].logprobs == [-1.0, -1.5] and results[2].top == [[], []] and results[2].row_argmax == [7, 8]
    assert results[1].all_logits is logits and results[0].all_logits is None and results[-1] is results[2]
    results[0].token_ids = [21, 22]  # rewritten (speculative verification): every later reader sees it
    assert results[0].token_ids == [21, 22] and results.first_ids()[0] == 21


def test_a_decode_step_results_are_its_id_list() -> None:
    ids = [4, 5, 6]
    results = StepResults([1, 1, 1], ids)
    assert results.first_ids() is ids  # no list made per step
    assert results[1].token_ids == [5] and results[1].logprobs == [0.0]
    empty = StepResults([0, 0])
    assert empty.first_ids() == [None, None] and [r.token_ids for r in empty] == [(), ()]


def test_batch_columns_views_write_through_and_finished_entries_drop() -> None:
    seqs = [Sequence(f"r{i}", [1, 2, 3], 8) for i in range(3)]
    batch = ScheduledBatch()
    for i, seq in enumerate(seqs):
        batch.add(seq, 1 + i, i == 2, i != 2)
    batch.cached[2] = 16
    entry = batch.entries[1]
    assert (entry.seq, entry.num_new_tokens, entry.is_prefill, entry.samples, entry.cached_tokens) == (
        seqs[1], 2, False, True, None)
    entry.num_new_tokens = 1  # speculative verification shortens an entry
    assert batch.num_new == [1, 1, 3] and batch.num_tokens == 5
    seqs[0].status = SequenceStatus.FINISHED
    batch.drop_finished()
    assert batch.seqs == seqs[1:] and batch.num_new == [1, 3] and batch.prefill == [False, True]
    assert batch.samples == [True, False] and batch.cached == {1: 16} and batch.entries[1].cached_tokens == 16
    assert len(batch) == 2 and bool(batch) and not ScheduledBatch()
