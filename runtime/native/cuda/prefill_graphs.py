"""CUDA graphs for steps that prefill up to MAX_PREFILL_SEQS sequences: one graph per token-count bucket.

Why: a 1,024-token prefill of Llama-3.2-1B is 4 ms of kernels on an H100/H200, but launched one by one from
Python (about 160 kernels, a third of them through Triton's launcher) the step took 8-16 ms of host time,
and how long varied from moment to moment with the lent VM's CPU. Replayed from a graph the step costs one
launch, so time to first token follows the GPU, not the host. Several sequences a graph, because streams whose
requests end at different steps send their next prompts a few at a time: each joins a step of decode rows,
which the model runner replays as a decode graph and a prefill graph, or as one mixed graph over both buffers
(runtime/native/cuda/mixed_graphs.py), instead of running the whole step op by op.

A graphed step is 1 to MAX_PREFILL_SEQS sequences, together at most the largest bucket's tokens: whole prompts
or chunks of them, over any cached context, on the base model, sampling from each one's last token only. The
tokens are padded to the bucket: padded tokens get KV slot -1 (nothing stored). The prefill kernel's query
tiles are inputs too, as many per graph as any split of its bucket into MAX_PREFILL_SEQS sequences can need;
the spare ones start past their sequence's tokens, and such a tile does nothing (projections and norms are
row by row, and attention reads keys from the cache, so padded rows are never read). Each sequence's last real
token's hidden state is selected on the device, so every graph writes MAX_PREFILL_SEQS rows of float32
logits, the first one per sequence valid.

Inputs come from one static int64 buffer, written by one host-to-device copy per step (`pack_prefill`): token
ids, positions and KV slots (the largest bucket's rows each; a graph reads its bucket's first rows), each
sequence's query start, context length, sequence length and last row, the tiles' sequences and first
queries, then the block tables. Graphs are captured again when `lora_version` changes (a Linear's weight moved
into a new buffer with adapter stacks); steps with an adapter run eagerly.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from runtime.native.attention_metadata import AttentionMetadata
from runtime.native.cuda.graphs import capture_buckets, pick_bucket
from runtime.native.cuda.paged_attention import PREFILL_TILE, PrefillTile, prefill_tile, prefill_tiles
from runtime.native.device import PinnedStaging

if TYPE_CHECKING:
    from runtime.native.lora.apply import LoraBatch
    from runtime.native.models import CausalLM
    from runtime.native.step_inputs import StepInput

logger = logging.getLogger(__name__)

MAX_PREFILL_GRAPH_TOKENS = 4096  # past this the launches are a small share of the step (and graphs cost memory)
MAX_PREFILL_SEQS = 8  # sequences a graph prefills; more prompts in one step than this run eagerly


def prefill_bucket_sizes(max_tokens: int) -> list[int]:
    """From 32, 1.5x and 4/3x in turn (32, 48, 64, 96, 128, 192, 256, ...), ending at max_tokens: padding costs
    at most half the step's GPU time, and 15 graphs cover 4,096 tokens."""
    sizes: list[int] = []
    size = 32
    while size < max_tokens:
        sizes.append(size)
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3
    sizes.append(max_tokens)
    return sizes


def tiles_for(tokens: int, block_m: int, seqs: int = MAX_PREFILL_SEQS) -> int:
    """The most query tiles of `block_m` rows that `tokens` new tokens split over at most `seqs` sequences can need."""
    return (tokens + (block_m - 1) * seqs) // block_m


class PrefillLayout(NamedTuple):
    """Where each input lives in the static buffer (offsets in int64 elements)."""

    rows: int  # token rows: ids at [0, rows), positions at [rows, 2 rows), slots at [2 rows, 3 rows)
    seqs: int  # sequence rows of the per-sequence fields
    tiles: int  # tile rows
    max_blocks: int  # block-table width
    tile: PrefillTile = PREFILL_TILE  # the prefill kernel's, for which the tile rows are made

    @property
    def query_start(self) -> int:  # seqs + 1 entries
        return 3 * self.rows

    @property
    def context(self) -> int:
        return self.query_start + self.seqs + 1

    @property
    def seq_lens(self) -> int:
        return self.context + self.seqs

    @property
    def last(self) -> int:
        return self.seq_lens + self.seqs

    @property
    def tile_seqs(self) -> int:
        return self.last + self.seqs

    @property
    def tile_offsets(self) -> int:
        return self.tile_seqs + self.tiles

    @property
    def tables(self) -> int:  # seqs rows of max_blocks
        return self.tile_offsets + self.tiles

    @property
    def size(self) -> int:
        return self.tables + self.seqs * self.max_blocks


def pack_prefill(inputs: Sequence[StepInput], block_size: int, layout: PrefillLayout, out: np.ndarray,
                 bucket: int) -> int:
    """Write the step's inputs into `out` (int64, laid out as `layout`) for the graph of `bucket` token rows (the
    rows past it, which that graph does not read, are left as they are); returns how many leading elements the
    device needs (the block tables past the last sequence's are left out of the copy). Few numpy calls: each costs
    microseconds of the host time before a prompt's graph starts (benchmarks/RESULTS.md, 2026-11-30)."""
    rows, seqs, tiles, width = layout.rows, layout.seqs, layout.tiles, layout.max_blocks
    lengths = [len(inp.token_ids) for inp in inputs]
    starts = [inp.start_pos for inp in inputs]
    ends = list(itertools.accumulate(lengths))
    total, spare = ends[-1], seqs - len(inputs)
    positions = out[rows: 2 * rows]
    slots = out[2 * rows: 3 * rows]
    tables_at = layout.tables
    in_block = np.arange(block_size)
    begin = 0
    for b, (inp, start, end) in enumerate(zip(inputs, starts, ends)):
        out[begin: end] = inp.token_ids
        positions[begin: end] = np.arange(start, start + end - begin)
        table = np.asarray(inp.block_table, dtype=np.int64)
        out[tables_at + b * width: tables_at + b * width + len(table)] = table
        # every slot of the table's blocks in position order; the sequence's new positions are a run of them
        slots[begin: end] = (table[:, None] * block_size + in_block).ravel()[start: start + end - begin]
        begin = end
    out[total: bucket] = 0
    positions[total: bucket] = 0
    slots[total: bucket] = -1
    tile_seqs, offsets = prefill_tiles(lengths, layout.tile.block_m)
    # the per-sequence fields and the tile map, in layout order: spare sequences empty at the end (query starts at
    # the total), spare tiles past sequence 0's tokens (they do nothing)
    out[layout.query_start: tables_at] = (
        [0, *ends] + [total] * spare + starts + [0] * spare + [s + n for s, n in zip(starts, lengths)] + [0] * spare
        + [e - 1 for e in ends] + [0] * spare + tile_seqs + [0] * (tiles - len(tile_seqs)) + offsets
        + [rows] * (tiles - len(offsets)))
    return tables_at + (len(inputs) - 1) * width + len(inputs[-1].block_table)


class PrefillGraphs:
    """Captured prefill steps of `model` over `kv_caches` (see the module docstring)."""

    def __init__(self, model: CausalLM, kv_caches: list[torch.Tensor], block_size: int, max_tokens: int,
                 max_blocks_per_seq: int, lora: LoraBatch | None = None,
                 lora_version: Callable[[], int] = lambda: 0, keep_hidden: bool = False) -> None:
        device = kv_caches[0].device
        self.model, self.kv_caches, self.block_size = model, kv_caches, block_size
        self.sizes = prefill_bucket_sizes(min(max_tokens, MAX_PREFILL_GRAPH_TOKENS))
        rows = self.sizes[-1]
        # the activations' dtype: the first parameter's, the embedding's (as the runner reads it)
        tile = prefill_tile(model.spec.head_dim, next(model.parameters()).dtype)
        self.layout = PrefillLayout(rows, MAX_PREFILL_SEQS, tiles_for(rows, tile.block_m), max_blocks_per_seq, tile)
        self.buffer = torch.zeros(self.layout.size, dtype=torch.long, device=device)
        self.staging = PinnedStaging(tuple(self.buffer.shape), self.buffer.dtype)
        self.logits = torch.empty((MAX_PREFILL_SEQS, model.spec.vocab_size), dtype=torch.float32,
                                  device=device)
        self.lora, self.lora_version = lora, lora_version
        # with keep_hidden (an EAGLE head reads them) every graph also copies all its rows' final hidden states into
        # one static [rows, hidden] buffer, allocated by the first forward (the largest bucket's warm-up, outside any
        # capture)
        self.keep_hidden = keep_hidden
        self.hidden: torch.Tensor | None = None
        self.captured_version = lora_version()
        self.pool = None
        self.graphs = self._capture()

    def step_inputs(self, bucket: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """A graph's view of the static buffer: the bucket's token ids and positions, and their metadata."""
        lay, buf = self.layout, self.buffer
        ids, positions, slots = buf[: 3 * lay.rows].view(3, lay.rows)[:, :bucket]
        seqs = lay.seqs
        meta = AttentionMetadata(
            query_start_loc=buf[lay.query_start: lay.query_start + seqs + 1],
            context_lens=buf[lay.context: lay.context + seqs],
            seq_lens=buf[lay.seq_lens: lay.seq_lens + seqs],
            block_tables=buf[lay.tables:].view(seqs, lay.max_blocks),
            slot_mapping=slots,
            block_size=self.block_size,
            max_query_len=bucket,
            max_seq_len=lay.max_blocks * self.block_size,
            query_lens_host=[bucket] * seqs,  # unread: the tiles below stand for them
            seq_lens_host=[lay.max_blocks * self.block_size] * seqs,
        )
        tiles = buf[lay.tile_seqs: lay.tables].view(2, lay.tiles)[:, :tiles_for(bucket, lay.tile.block_m)]
        meta.derived["triton_prefill_tiles"] = (tiles, lay.tile)
        return ids, positions, meta

    @property
    def last_rows(self) -> torch.Tensor:
        """On the device: each sequence's last new token's row (spare sequences: 0)."""
        return self.buffer[self.layout.last: self.layout.last + self.layout.seqs]

    def _forward(self, bucket: int) -> None:
        ids, positions, meta = self.step_inputs(bucket)
        hidden = self.model(ids, positions, self.kv_caches, meta)
        if self.keep_hidden:
            if self.hidden is None:
                self.hidden = hidden.new_empty((self.layout.rows, hidden.shape[1]))
            self.hidden[:bucket].copy_(hidden)
        self.model.compute_logits(hidden.index_select(0, self.last_rows), out=self.logits)

    def pad_for_capture(self) -> None:
        """Before a capture: every row padding, so the warm-up forwards store nothing, and every tile past its
        tokens."""
        lay = self.layout
        torch.cuda.synchronize()  # no replay is still to read the buffer
        self.buffer.zero_()
        self.buffer[2 * lay.rows: 3 * lay.rows].fill_(-1)
        self.buffer[lay.tile_offsets: lay.tables].fill_(lay.rows)

    def _capture(self) -> dict[int, torch.cuda.CUDAGraph]:
        started = time.perf_counter()
        self.pad_for_capture()
        if self.lora is not None:
            self.lora.clear()  # a base capture must not record the hooks of the last eager adapter step
        graphs, self.pool = capture_buckets(self.sizes, self._forward, self.pool)
        logger.info("CUDA graphs: captured %d prefill lengths (%s), up to %d sequences, in %.1f s", len(self.sizes),
                    ",".join(map(str, self.sizes)), MAX_PREFILL_SEQS, time.perf_counter() - started)
        return graphs

    def accepts(self, inputs: Sequence[StepInput]) -> bool:
        """1 to MAX_PREFILL_SEQS sequences on the base model, together no more tokens than the largest bucket,
        logits of each one's last token at most."""
        if not 0 < len(inputs) <= MAX_PREFILL_SEQS:
            return False
        tokens = 0
        for inp in inputs:
            if (inp.adapter_slot >= 0 or inp.return_all_logits or inp.prev_sample >= 0
                    or len(inp.block_table) > self.layout.max_blocks):
                return False
            tokens += len(inp.token_ids)
        return tokens <= self.layout.rows

    def run(self, inputs: Sequence[StepInput]) -> torch.Tensor:
        """Replay the bucket's graph; float32 logits [len(inputs), vocab] of each input's last token (valid until
        the next run; with keep_hidden, `hidden`'s first rows hold every new token's final hidden state, in order)."""
        version = self.lora_version()
        if version != self.captured_version:
            self.graphs = {}  # free them before capturing their replacements
            self.graphs = self._capture()
            self.captured_version = version
        bucket = pick_bucket(self.sizes, sum(len(inp.token_ids) for inp in inputs))
        assert bucket is not None
        self.stage(inputs, bucket)
        self.graphs[bucket].replay()
        return self.logits[: len(inputs)]

    def stage(self, inputs: Sequence[StepInput], bucket: int) -> None:
        """Queue the copy of the step's inputs into the static buffer (pack_prefill) for the graph of `bucket` rows."""
        staged = self.staging.take()
        used = pack_prefill(inputs, self.block_size, self.layout, staged.numpy(), bucket)
        self.staging.copy(self.buffer[:used], staged[:used])
