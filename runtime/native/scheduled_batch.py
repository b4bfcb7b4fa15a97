"""ScheduledBatch: what the scheduler picked for one step, as columns; ScheduledSeq: a view of one entry.

The type the scheduler hands to the engine core (and back to `Scheduler.update_from_output`), in a module of its
own so that the core, the speculator and the scheduler import it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime.native.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    """One step's sequences as columns, in the order the step runs them (decodes first). A 256-row step makes no
    object per sequence; `entries` gives ScheduledSeq views for code that hands single entries around."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new: list[int] = field(default_factory=list)  # tokens computed this step: num_computed_tokens .. + n - 1
    prefill: list[bool] = field(default_factory=list)  # Sequence.is_prefill when scheduled
    samples: list[bool] = field(default_factory=list)  # the step reaches the end of the tokens: the next one is sampled
    cached: dict[int, int] = field(default_factory=dict)  # entry admitted this step -> its prompt tokens served
    # from the prefix cache
    copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst) blocks
    preempted: list[Sequence] = field(default_factory=list)

    def add(self, seq: Sequence, num_new: int, is_prefill: bool, samples: bool) -> None:
        self.seqs.append(seq)
        self.num_new.append(num_new)
        self.prefill.append(is_prefill)
        self.samples.append(samples)

    @property
    def entries(self) -> list[ScheduledSeq]:
        return [ScheduledSeq(self, i) for i in range(len(self.seqs))]

    def drop_finished(self) -> None:
        """Drop the entries whose sequence finished (ended while the step in flight was collected)."""
        keep = [i for i, seq in enumerate(self.seqs) if seq.status is not SequenceStatus.FINISHED]
        if len(keep) == len(self.seqs):
            return
        self.cached = {new: self.cached[old] for new, old in enumerate(keep) if old in self.cached}
        for column in (self.seqs, self.num_new, self.prefill, self.samples):
            column[:] = [column[i] for i in keep]

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new)

    def __len__(self) -> int:
        return len(self.seqs)


class ScheduledSeq:
    """Entry `i` of a ScheduledBatch, read from and written to its columns (speculative verification shortens an
    entry to the tokens it accepted)."""

    __slots__ = ("_batch", "_i")

    def __init__(self, batch: ScheduledBatch, i: int) -> None:
        self._batch, self._i = batch, i

    @property
    def seq(self) -> Sequence:
        return self._batch.seqs[self._i]

    @property
    def num_new_tokens(self) -> int:
        return self._batch.num_new[self._i]

    @num_new_tokens.setter
    def num_new_tokens(self, value: int) -> None:
        self._batch.num_new[self._i] = value

    @property
    def is_prefill(self) -> bool:
        return self._batch.prefill[self._i]

    @property
    def samples(self) -> bool:
        return self._batch.samples[self._i]

    @property
    def cached_tokens(self) -> int | None:
        """Admitted this step: prompt tokens served from the prefix cache."""
        return self._batch.cached.get(self._i)
