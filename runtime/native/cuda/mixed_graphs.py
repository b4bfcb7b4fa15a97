"""CUDA graphs for steps where prompts join decode rows: one forward pass over both, the weights read once.

Why: streams whose requests end at different steps bring a prompt or two to most steps. Replayed as a decode
graph plus a prefill graph (runtime/native/model_runner.py), such a step reads every weight twice: Llama-3.2-1B's 2.5 GB
are 0.5 ms of an H200's memory bandwidth, on decode steps of 1.4-1.6 ms at 64 streams.

A mixed graph is keyed by (decode rows, prompt tokens), each padded to a bucket: the decode graphs' row
counts that are powers of two (and their largest), and the prefill graphs' token counts that are powers of two,
up to MAX_MIXED_PROMPT_TOKENS; larger prompts take the two replays. It reads its inputs from the decode and
prefill graphs' own buffers, written the same way (`DecodeGraphs.stage`, `PrefillGraphs.stage`), and replays in
the decode graphs' turn, so the decode rows' pending tokens and pinned sets work as in a decode step. The
attention layer runs the decode rows and the prompts as two calls (AttentionMetadata.decode); every other layer
runs once over all rows. It writes float32 logits for every decode row (padding included), then each prompt's
last token, MAX_PREFILL_SEQS rows of them; the sampler picks from those.

Steps with a LoRA adapter are not taken. Graphs are captured again when `lora_version` changes (a Linear's weight
moved into a new buffer with adapter stacks).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from runtime.native.cuda.graphs import SETS, DecodeGraphs, capture_buckets, pick_bucket
from runtime.native.cuda.prefill_graphs import PrefillGraphs
from runtime.native.decode_rows import ADAPTERS, POSITIONS, pack_rows

if TYPE_CHECKING:
    from runtime.native.block_tables import BlockTables
    from runtime.native.step_inputs import StepInputs

logger = logging.getLogger(__name__)

MAX_MIXED_PROMPT_TOKENS = 512  # past this a prompt's own pass is long enough that a second read of the weights is small


def mixed_buckets(decode_sizes: Sequence[int], prefill_sizes: Sequence[int]) -> tuple[list[int], list[int]]:
    """(decode row counts, prompt token counts) that mixed graphs are captured for: the powers of two among the
    decode graphs' sizes (and their largest), and among the prefill graphs' up to MAX_MIXED_PROMPT_TOKENS (and the
    largest of those): at most 2x padding, and 35 graphs a set for a batch of 64."""
    rows = [s for s in decode_sizes if s & (s - 1) == 0 or s == decode_sizes[-1]]
    small = [s for s in prefill_sizes if s <= MAX_MIXED_PROMPT_TOKENS]
    tokens = [s for s in small if s & (s - 1) == 0 or s == small[-1]]
    return rows, tokens


class MixedGraphs:
    """Captured steps of decode rows and prompts together, over `decode`'s and `prefill`'s buffers (see the
    module docstring)."""

    def __init__(self, decode: DecodeGraphs, prefill: PrefillGraphs,
                 lora_version: Callable[[], int] = lambda: 0) -> None:
        self.decode, self.prefill = decode, prefill
        self.rows, self.tokens = mixed_buckets(decode.sizes, prefill.sizes)
        device = decode.logits.device
        seqs = prefill.layout.seqs
        self.logits = torch.empty((self.rows[-1] + seqs, decode.logits.shape[1]), dtype=torch.float32, device=device)
        self.row_ids = torch.arange(self.rows[-1], dtype=torch.long, device=device)
        self.lora_version = lora_version
        self.captured_version = lora_version()
        self.pool = None
        self.graphs = self._capture()

    def _forward(self, rows: int, tokens: int, turn: int) -> None:
        decode, prefill = self.decode, self.prefill
        decode.load(rows, turn)
        ids, positions, meta = prefill.step_inputs(tokens)
        meta.decode = decode.meta(rows)
        hidden = decode.model(torch.cat((decode.ids[:rows], ids)),
                              torch.cat((decode.packed[POSITIONS, :rows], positions)), decode.kv_caches, meta)
        # every decode row, then each prompt's last token (its row among the prompts' rows, after the decode rows)
        picked = hidden.index_select(0, torch.cat((self.row_ids[:rows], prefill.last_rows + rows)))
        decode.model.compute_logits(picked, out=self.logits[: rows + prefill.layout.seqs])

    def _capture(self) -> list[dict[tuple[int, int], torch.cuda.CUDAGraph]]:
        started = time.perf_counter()
        kept = self.decode.pad_for_capture()
        self.prefill.pad_for_capture()
        if self.decode.lora is not None:
            self.decode.lora.clear()  # a base capture must not record the hooks of the last eager adapter step
        keys = [(rows, tokens) for rows in self.rows for tokens in self.tokens]
        sets = []
        for turn in range(SETS):
            graphs, self.pool = capture_buckets(keys, lambda key, turn=turn: self._forward(*key, turn), self.pool)
            sets.append(graphs)
        self.decode.restore(kept)
        logger.info("CUDA graphs: captured %d mixed steps (decode rows %s x prompt tokens %s), %d sets, in %.1f s",
                    len(keys), ",".join(map(str, self.rows)), ",".join(map(str, self.tokens)), SETS,
                    time.perf_counter() - started)
        return sets

    def accepts(self, rest: StepInputs, prompts: StepInputs) -> bool:
        """`rest` fits a decode graph without an adapter, `prompts` a prefill graph and MAX_MIXED_PROMPT_TOKENS."""
        return (bool(rest) and self.decode.accepts(rest)
                and max(rest.adapter_slots) < 0 and self.prefill.accepts(prompts)
                and len(prompts.token_ids) <= self.tokens[-1])

    def run(self, rest: StepInputs, prompts: StepInputs, last_sampled: torch.Tensor | None,
            resident: BlockTables | None = None) -> tuple[torch.Tensor, int]:
        """Replay the step's graph: float32 logits of every decode row then each prompt's last token (valid until
        the next run), and the decode rows' bucket (the first prompt's row). `resident`: as for DecodeGraphs.run."""
        version = self.lora_version()
        if version != self.captured_version:
            self.graphs = []  # free them before capturing their replacements
            self.graphs = self._capture()
            self.captured_version = version
        columns, tables = pack_rows(rest, self.decode.block_size, resident)
        rows = pick_bucket(self.rows, tables.shape[0])
        tokens = pick_bucket(self.tokens, len(prompts.token_ids))
        assert rows is not None and tokens is not None and columns[ADAPTERS].max() < 0
        graph = self.graphs[self.decode.turn][(rows, tokens)]
        self.decode.stage(columns, tables, rows, last_sampled)
        self.prefill.stage(prompts, tokens)
        graph.replay()
        self.decode.replayed_now()
        return self.logits[: rows + len(prompts)], rows
