"""Draft-model proposer: a small model of the same tokenizer guesses the next k tokens.

The draft keeps its own paged KV cache, booked by a second BlockManager (the same code as the target's,
without prefix caching) in a shadow Sequence per target sequence. Each step it first catches up on the
target's tokens it has not seen (the prompt at first, then the tokens accepted since), then runs k
one-token forwards batched over every drafting sequence. After verification its cache is rolled back to
the longest prefix it shares with the target's tokens, and surplus blocks are freed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence as Seq
from dataclasses import dataclass
from pathlib import Path

import torch

from runtime.block_manager import BlockManager
from runtime.model_runner import ModelRunner, StepInput
from runtime.models import ModelSpec, kv_cache_bytes_per_token, load_model
from runtime.sampler import Sampler, SamplingRow, processed_probs
from runtime.sequence import Sequence, SequenceStatus
from runtime.tokenizer import Tokenizer

RowFactory = Callable[[list[int]], SamplingRow]  # the target's sampling row after these draft tokens


class DraftTokenizerMismatchError(ValueError):
    """The draft model's tokenizer differs from the target's (a start-up error)."""


def check_same_tokenizer(target: Tokenizer, draft_path: str) -> None:
    """Raise DraftTokenizerMismatchError unless `draft_path`'s tokenizer maps text to the same ids."""
    try:
        draft = Tokenizer.from_pretrained(draft_path)
    except Exception as exc:  # noqa: BLE001 - any load failure is the same start-up error
        raise DraftTokenizerMismatchError(
            f"--draft-model {draft_path}: cannot load its tokenizer ({exc}); the draft must ship the target's tokenizer"
        ) from exc
    if draft.hf.get_vocab() != target.hf.get_vocab():
        raise DraftTokenizerMismatchError(
            f"--draft-model {draft_path}: its tokenizer differs from the target model's "
            f"({len(draft.hf)} vs {len(target.hf)} tokens, or different ids); speculative decoding needs the same tokenizer"
        )


@dataclass
class DraftProposal:
    token_ids: list[int]
    probs: torch.Tensor  # [len(token_ids), target vocab] q of each draft (greedy targets never read it)


@dataclass
class DraftJob:
    """One target sequence asking for up to k draft tokens."""

    seq: Sequence
    k: int
    make_row: RowFactory
    generator: torch.Generator | None


class DraftProposer:
    """Runs the draft model over its own paged KV cache (see the module docstring)."""

    def __init__(self, path: str, target_vocab_size: int, dtype: torch.dtype, device: torch.device,
                 block_size: int, generator: torch.Generator) -> None:
        if not (Path(path) / "config.json").is_file():
            raise ValueError(f"--draft-model {path}: no config.json there (expected a Hugging Face model folder)")
        self.spec = ModelSpec.from_pretrained(path)
        self.model = load_model(path, dtype, device)
        self.runner = ModelRunner(self.model, block_size, Sampler(0))
        self.block_size = block_size
        self.vocab = target_vocab_size
        self.generator = generator
        self.dtype, self.device = dtype, device
        self.block_manager: BlockManager | None = None
        self._shadows: dict[int, tuple[Sequence, Sequence]] = {}  # target seq_id -> (target, draft shadow)

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_cache_bytes_per_token(self.spec, self.dtype)

    @property
    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def allocate(self, num_blocks: int) -> None:
        """Give the draft as many KV blocks as the target has (same tokens, its own bytes per token)."""
        self.runner.allocate_kv_cache(num_blocks)
        self.block_manager = BlockManager(num_blocks, self.block_size, enable_prefix_caching=False)

    def release_finished(self) -> None:
        """Free the shadows of target sequences that no longer run (finished, aborted, preempted)."""
        bm = self.block_manager
        for seq_id, (target, shadow) in list(self._shadows.items()):
            if target.status is not SequenceStatus.RUNNING:
                bm.free(shadow)  # type: ignore[union-attr]
                del self._shadows[seq_id]

    def propose(self, jobs: Seq[DraftJob]) -> list[DraftProposal]:
        """Up to `job.k` tokens for every job (an empty proposal where the draft cache is full)."""
        assert self.block_manager is not None, "allocate() first"
        bm = self.block_manager
        out = [DraftProposal([], torch.empty(0, self.vocab)) for _ in jobs]
        pending: list[tuple[int, list[int]]] = []  # (job index, tokens to feed next)
        for i, job in enumerate(jobs):
            shadow = self._shadow(job.seq)
            new = self._rollback(shadow, job.seq.token_ids)
            if job.seq.num_tokens + job.k > self.spec.max_position_embeddings:
                continue
            if not bm.can_append(shadow, len(new) + job.k - 1):
                continue
            bm.append_slots(shadow, len(new) + job.k - 1)
            pending.append((i, new))
        probs: dict[int, list[torch.Tensor]] = {i: [] for i, _ in pending}
        while pending:
            inputs = []
            rows = []
            for i, feed in pending:
                shadow = self._shadows[jobs[i].seq.seq_id][1]
                row = jobs[i].make_row(out[i].token_ids)
                rows.append(row)
                # all logits (usually 1-2 rows) rather than the runner's sampler: we draw from q ourselves
                inputs.append(StepInput(token_ids=feed, start_pos=shadow.num_computed_tokens,
                                        block_table=shadow.block_table, return_all_logits=True))
            results = self.runner.execute(inputs)
            logits = torch.cat([self._fit_vocab(r.all_logits[-1:]) for r in results])  # type: ignore[index]
            q, chosen = self._draw(logits, rows, [jobs[i].generator for i, _ in pending])
            still = []
            for row_i, (i, feed) in enumerate(pending):
                shadow = self._shadows[jobs[i].seq.seq_id][1]
                shadow.num_computed_tokens += len(feed)
                token = chosen[row_i]
                shadow.append_token(token)
                out[i].token_ids.append(token)
                probs[i].append(q[row_i])
                if len(out[i].token_ids) < jobs[i].k:
                    still.append((i, [token]))
            pending = still
        for i, rows_q in probs.items():
            out[i].probs = torch.stack(rows_q)
        return out

    def _shadow(self, seq: Sequence) -> Sequence:
        entry = self._shadows.get(seq.seq_id)
        if entry is None:
            shadow = Sequence(seq.request_id, [], 0)
            shadow.status = SequenceStatus.RUNNING
            entry = self._shadows[seq.seq_id] = (seq, shadow)
        return entry[1]

    def _rollback(self, shadow: Sequence, target_tokens: list[int]) -> list[int]:
        """Keep the shadow's cache for the prefix it shares with the target; return the tokens to feed."""
        computed = shadow.num_computed_tokens
        same = 0
        limit = min(computed, len(target_tokens) - 1)  # the target's last token is always fed: its logits are needed
        while same < limit and shadow.token_ids[same] == target_tokens[same]:
            same += 1
        shadow.num_computed_tokens = same
        shadow.token_ids = list(target_tokens)
        self.block_manager.trim(shadow, same)  # type: ignore[union-attr]
        return shadow.token_ids[same:]

    def _fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """The draft's logits over the target's vocabulary (checkpoints may pad their embeddings differently)."""
        v = logits.shape[-1]
        if v == self.vocab:
            return logits
        if v > self.vocab:
            return logits[:, : self.vocab]
        pad = torch.full((logits.shape[0], self.vocab - v), float("-inf"), dtype=logits.dtype)
        return torch.cat([logits, pad], dim=-1)

    def _draw(self, logits: torch.Tensor, rows: list[SamplingRow], generators: list[torch.Generator | None]
              ) -> tuple[torch.Tensor, list[int]]:
        """(q [N, V], drawn tokens). Greedy targets ignore q (their verification is an argmax match), so
        an all-greedy round skips the processing and takes the draft's raw argmax."""
        if all(row.options.greedy for row in rows):
            return logits, logits.argmax(dim=-1).tolist()
        q = processed_probs(logits, rows)
        greedy = q.argmax(dim=-1).tolist()
        out = []
        for i, row in enumerate(rows):
            if row.options.greedy:
                out.append(greedy[i])
            else:
                out.append(int(torch.multinomial(q[i], 1, generator=generators[i] or self.generator)))
        return q, out
