"""Sequence: one sample's token list, progress and KV block table, as the scheduler sees it.

A request with n > 1 starts as ONE sequence (`num_samples == n`) that prefills the prompt once; when
its first tokens are sampled it forks into n sequences sharing the prompt's blocks (scheduler.fork).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence as SequenceABC

_seq_ids = itertools.count()
# A token sampled by a step still running on the device (the engine core's async scheduling): it holds the
# sequence's place until the step's ids reach the host; the next step reads its value on the device.
PENDING_TOKEN = -1


class OutputTokens(SequenceABC):
    """A live view of a sequence's output ids: sampling rows keep one instead of copying the ids each step."""

    __slots__ = ("_seq",)

    def __init__(self, seq: Sequence) -> None:
        self._seq = seq

    def __len__(self) -> int:
        return len(self._seq.token_ids) - self._seq.num_prompt_tokens

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        return self._seq.output_token_ids[index]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._seq.output_token_ids)


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # queued, or preempted and waiting to recompute
    RUNNING = "running"  # holds KV blocks
    FINISHED = "finished"


class Sequence:
    """Tokens (prompt + generated), how many have KV in the cache, and the blocks holding them."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        max_tokens: int,
        *,
        index: int = 0,
        num_samples: int = 1,
        beam_width: int = 1,
        cache_salt: str | None = None,
        needs_prompt_logits: bool = False,
    ) -> None:
        self.seq_id = next(_seq_ids)
        self.request_id = request_id
        self.index = index  # sample index within the request (OutputDelta.index)
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.max_len = len(prompt_token_ids) + max_tokens  # the sequence never grows past this
        self.num_samples = num_samples  # > 1 until the prompt is prefilled and the sequence forks
        # > 1 until a beam-search request's first round forks it (runtime/native/beam_search.py): admission reserves KV
        # room for every beam it will fork into
        self.beam_width = beam_width
        self.cache_salt = cache_salt  # e.g. the LoRA adapter: prefix blocks only match the same salt
        # Prompt logprobs / context logits need every prompt position computed, so no prefix-cache hits.
        self.needs_prompt_logits = needs_prompt_logits
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.table_row = -1  # its row in the BlockManager's resident tables (runtime/native/block_tables.py); -1: none
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.num_cached_tokens = 0  # prefix-cache hits at the first admission (usage.cached_tokens)
        self.num_committed_blocks = 0  # leading full blocks already offered to the prefix cache
        # leading blocks given back as outside every layer's sliding window (BlockManager.release_outside_window):
        # their ids stay in the table, stale, and are never read
        self.num_released_blocks = 0
        self.block_hashes: list[int] = []  # chained hash per full block, filled lazily
        self.num_preemptions = 0

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, request={self.request_id!r}, index={self.index}, "
            f"tokens={self.num_tokens}, computed={self.num_computed_tokens}, status={self.status.name})"
        )

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        """True while computing the prompt (or recomputing after preemption), False when decoding."""
        return self.num_computed_tokens < self.num_prompt_tokens or self.num_uncomputed_tokens > 1

    @property
    def fanout(self) -> int:
        """Sequences this one will become (n samples or beams): what admission must leave room for."""
        return max(self.num_samples, self.beam_width)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def add_sampled(self, token_id: int) -> None:
        """The token the last step sampled: it takes the place held by PENDING_TOKEN, if any."""
        if self.token_ids[-1] == PENDING_TOKEN:
            self.token_ids[-1] = token_id
        else:
            self.token_ids.append(token_id)

    def fork(self, index: int) -> Sequence:
        """A copy for sample `index` with the same tokens and progress; blocks are shared by the caller."""
        child = Sequence.__new__(Sequence)
        child.__dict__.update(self.__dict__)
        child.seq_id = next(_seq_ids)
        child.index = index
        child.num_samples = 1
        child.token_ids = list(self.token_ids)
        child.block_table = list(self.block_table)
        child.table_row = -1  # BlockManager.fork gives it its own row
        child.block_hashes = list(self.block_hashes)
        child.num_cached_tokens = 0  # the parent reports the request's prefix hits once
        return child
