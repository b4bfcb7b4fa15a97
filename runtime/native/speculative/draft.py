"""Draft-model proposer: a small model of the same tokenizer guesses the next k tokens.

The draft keeps its own paged KV cache, booked by a second BlockManager (the same code as the target's,
without prefix caching) in a shadow Sequence per target sequence. Each step it first catches up on the
target's tokens it has not seen (the prompt at first, then the tokens accepted since), then runs k
one-token forwards batched over every drafting sequence. After verification its cache is rolled back to
the longest prefix it shares with the target's tokens, and surplus blocks are freed.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from pathlib import Path

import torch

from runtime.native.block_manager import BlockManager
from runtime.native.decode_rows import MAX_ROWS_PER_SEQ
from runtime.native.model_runner import ModelRunner
from runtime.model_spec import ModelSpec
from runtime.native.models import kv_cache_bytes_per_token, load_model
from runtime.request import SamplingOptions
from runtime.native.sampler import Sampler, SamplingRow, processed_probs
from runtime.native.sequence import Sequence, SequenceStatus
from runtime.native.speculative.rows import TargetRows
from runtime.native.step_inputs import StepInput
from runtime.tokenizer import Tokenizer


class DraftTokenizerMismatchError(ValueError):
    """The draft model's tokenizer differs from the target's (a start-up error)."""


def check_same_tokenizer(target: Tokenizer, draft_path: str) -> None:
    """Raise DraftTokenizerMismatchError unless `draft_path`'s tokenizer maps text to the same ids."""
    try:
        draft = Tokenizer.from_pretrained(draft_path)
    except Exception as exc:
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
    # [len(token_ids), target vocab] on the CPU: q of each draft, for rejection sampling (sampled targets);
    # None for greedy targets, whose verification only compares ids
    probs: torch.Tensor | None


@dataclass
class DraftJob:
    """One target sequence asking for up to k draft tokens."""

    seq: Sequence
    k: int
    target: TargetRows
    generator: torch.Generator  # on the CPU: draws the drafts of a sampled target


@dataclass
class _Shadow:
    """The draft's copy of one target sequence."""

    target: Sequence
    seq: Sequence  # the draft's tokens, computed count and block table
    synced: int = 0  # leading tokens equal to the target's (a running sequence's tokens only ever grow)


# A greedy row that edits nothing: the runner's sampler takes the raw argmax on the device and copies back
# only the id. Drafts of greedy targets use it (an exact verification does not need them processed).
_RAW_ARGMAX = SamplingRow(SamplingOptions(temperature=0.0), (), (), None, ())


class DraftProposer:
    """Runs the draft model over its own paged KV cache (see the module docstring)."""

    def __init__(self, path: str, target_vocab_size: int, dtype: torch.dtype, device: torch.device,
                 block_size: int) -> None:
        if not (Path(path) / "config.json").is_file():
            raise ValueError(f"--draft-model {path}: no config.json there (expected a Hugging Face model folder)")
        self.spec = ModelSpec.from_pretrained(path)
        self.model = load_model(path, dtype, device)
        self.runner = ModelRunner(self.model, block_size, Sampler(0))
        self.block_size = block_size
        self.vocab = target_vocab_size
        # a draft with more (padding) ids than the target: its argmax must be taken over the target's ids
        self._wider_vocab = self.spec.vocab_size > target_vocab_size
        self.dtype, self.device = dtype, device
        self.block_manager: BlockManager | None = None
        self._shadows: dict[int, _Shadow] = {}  # by target seq_id

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_cache_bytes_per_token(self.spec, self.dtype)

    @property
    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def allocate(self, num_blocks: int, graphs: tuple[int, int] | None = None) -> None:
        """Give the draft as many KV blocks as the target has (same tokens, its own bytes per token);
        `graphs` = (max_rows, max_blocks_per_seq): capture CUDA graphs of its steps, as the target does."""
        self.runner.allocate_kv_cache(num_blocks)
        self.block_manager = BlockManager(num_blocks, self.block_size, enable_prefix_caching=False)
        self.runner.block_tables = self.block_manager.tables
        if graphs is not None:
            self.runner.capture_decode_graphs(*graphs)
        if self.device.type == "cuda":
            self._compile_catch_up()

    def _compile_catch_up(self) -> None:
        """Run one catch-up-shaped step (more tokens than a decode graph takes, so op by op) into the free cache, so
        its Triton kernels are compiled now and not in the first speculating step (0.5-1 s there, H200)."""
        tokens = MAX_ROWS_PER_SEQ + 1
        table = list(range(-(-tokens // self.block_size)))
        self.runner.execute([StepInput(token_ids=[0] * tokens, start_pos=0, block_table=table,
                                       sample_rows=[_RAW_ARGMAX])])

    def release_finished(self) -> None:
        """Free the shadows of target sequences that no longer run (finished, aborted, preempted)."""
        bm = self.block_manager
        for seq_id, shadow in list(self._shadows.items()):
            if shadow.target.status is not SequenceStatus.RUNNING:
                bm.free(shadow.seq)  # type: ignore[union-attr]
                del self._shadows[seq_id]

    def propose(self, jobs: Seq[DraftJob]) -> list[DraftProposal]:
        """Up to `job.k` tokens for every job (an empty proposal where the draft cache is full)."""
        assert self.block_manager is not None, "allocate() first"
        bm = self.block_manager
        out = [DraftProposal([], None) for _ in jobs]
        pending: list[tuple[int, Sequence, list[int]]] = []  # (job index, draft shadow, tokens to feed next)
        for i, job in enumerate(jobs):
            entry = self._shadows.get(job.seq.seq_id)
            if entry is None:
                entry = self._shadows[job.seq.seq_id] = _Shadow(job.seq, Sequence(job.seq.request_id, [], 0))
                entry.seq.status = SequenceStatus.RUNNING
            new = self._rollback(entry, job.seq.token_ids)
            if job.seq.num_tokens + job.k > self.spec.max_position_embeddings:
                continue
            if not bm.can_append(entry.seq, len(new) + job.k - 1):
                continue
            bm.append_slots(entry.seq, len(new) + job.k - 1)
            pending.append((i, entry.seq, new))
        probs: dict[int, list[torch.Tensor]] = {i: [] for i, _, _ in pending if not jobs[i].target.greedy}
        # where the draft is the raw argmax, the runner's sampler takes it on the device and only ids come back;
        # the others' logits stay on the device for _draw
        direct = [job.target.greedy and not self._wider_vocab for job in jobs]
        while pending:
            inputs = [StepInput(token_ids=feed, start_pos=shadow.num_computed_tokens, block_table=shadow.block_table,
                                table_row=shadow.table_row, sample_rows=[_RAW_ARGMAX],
                                return_sample_logits=not direct[i],
                                logits_on_device=not direct[i])
                      for i, shadow, feed in pending]
            results = self.runner.execute(inputs)
            chosen = [r.token_ids[0] for r in results]
            rest = [n for n, (i, _, _) in enumerate(pending) if not direct[i]]
            if rest:
                idx = [pending[n][0] for n in rest]
                drawn, q = self._draw([results[n].sample_logits for n in rest],  # type: ignore[misc]
                                      [jobs[i] for i in idx], [out[i].token_ids for i in idx])
                for m, (n, i) in enumerate(zip(rest, idx)):
                    chosen[n] = drawn[m]
                    if i in probs:
                        probs[i].append(q[m])  # type: ignore[index]
            still = []
            for (i, shadow, feed), token in zip(pending, chosen):
                shadow.num_computed_tokens += len(feed)
                shadow.append_token(token)
                out[i].token_ids.append(token)
                if len(out[i].token_ids) < jobs[i].k:
                    still.append((i, shadow, [token]))
            pending = still
        for i, rows_q in probs.items():
            out[i].probs = torch.stack(rows_q)
        return out

    def _rollback(self, shadow: _Shadow, target_tokens: list[int]) -> list[int]:
        """Keep the shadow's cache for the prefix it shares with the target; return the tokens to feed."""
        seq = shadow.seq
        limit = min(seq.num_computed_tokens, len(target_tokens) - 1)  # the target's last token is always fed
        same = min(shadow.synced, limit)  # only the drafts past the last sync can differ: a few compares
        while same < limit and seq.token_ids[same] == target_tokens[same]:
            same += 1
        seq.num_computed_tokens = same
        seq.token_ids = list(target_tokens)
        shadow.synced = len(target_tokens)
        self.block_manager.trim(seq, same)  # type: ignore[union-attr]
        return seq.token_ids[same:]

    def _fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """The draft's logits over the target's vocabulary (checkpoints may pad their embeddings differently)."""
        v = logits.shape[-1]
        if v == self.vocab:
            return logits
        if v > self.vocab:
            return logits[:, : self.vocab]
        pad = torch.full((logits.shape[0], self.vocab - v), float("-inf"), dtype=logits.dtype, device=logits.device)
        return torch.cat([logits, pad], dim=-1)

    def _draw(self, logits: list[torch.Tensor], jobs: list[DraftJob], drafted: list[list[int]]
              ) -> tuple[list[int], torch.Tensor | None]:
        """(tokens, q [N, V] on the CPU or None) from the draft's raw logits ([1, V] each, on the device).

        Greedy targets take the argmax over the target's ids. Sampled ones draw from q, the draft's
        distribution under the target's processing, with their CPU generator (q moves to the CPU once:
        the draw and the verification read it there)."""
        x = self._fit_vocab(torch.cat(logits))
        if all(job.target.greedy for job in jobs):
            return x.argmax(dim=-1).tolist(), None
        q = processed_probs(x, [job.target.after(tokens) for job, tokens in zip(jobs, drafted)]).cpu()
        greedy = q.argmax(dim=-1).tolist()
        return [greedy[m] if job.target.greedy else int(torch.multinomial(q[m], 1, generator=job.generator))
                for m, job in enumerate(jobs)], q
