"""CUDA graphs for decode-shaped steps: one graph per row-count bucket, replayed with the rows padded.

Why: a decode step launches hundreds of small kernels; launched one by one from Python the step is
bound by the host. A captured graph replays them with one launch.

A graph row is one new token: its id, position, KV slot and the length of its sequence up to and
including it. A plain decode step has one row per sequence; a step that continues a sequence with
several tokens (speculative verification of K drafts plus one, a draft model catching up) has one row
per token, each attending over the cache up to its own position: every row's K/V is stored before
attention runs, so the decode kernel sees the step's earlier tokens, causally, with no extra kernel (where RoPE,
the store and attention are one kernel, each row's program also stores the rows before it of its sequence:
runtime/native/cuda/fused.py).

Each graph reads its inputs from one static int32 buffer: ids, positions, slots, lengths, LoRA
adapter slots and "previous sample" rows packed as int64 [6, max_rows], then the rows' block tables,
int32 [max_rows, max_blocks]. Padded rows get KV slot -1 (their K/V is not stored), length 0
(attention returns zeros) and adapter -1, so they touch nothing. Every graph writes float32 logits,
one per row, into the same [max_rows, vocab] buffer.

The greedy token of every row is taken inside the graph too (argmax, into `sampled`), and a row whose
token the previous step sampled on the device (the engine's async scheduling) names that token's row
of `sampled`, read inside the next graph. The graph's first kernel reads its inputs from a pinned host
buffer and its last writes the greedy ids to another (runtime/native/cuda/step_io.py), so a plain greedy
decode step is one operation on the device. Launched on their own, the sampler's five kernels and the
pending-token copy took 180 us of host per batch-1 step on the H200, and each copy on the stream or
in the graph left the device idle 5-13 us. Steps that sample otherwise run the sampler on the graph's
logits; their ids are copied into `sampled` before the next graph reads them.

Graphs come in two sets, replayed in turn, each with its own pinned buffers: the host writes the next
step's inputs while the device may still be about to read the current step's, and the current step's
ids are still unread when the next step is launched. A set is used again only once its last replay has
run (an event), and the engine collects a step's ids before it launches the step after next.

Steps where a sequence uses a LoRA adapter replay a second set of graphs with the adapter work in
them (runtime/native/lora/apply.py reads the per-row adapter slots from the static buffer); base-model steps
keep the set without it. The LoRA set is captured on the first adapter step. Both sets are captured
again when `lora_version` changes: a Linear got adapter stacks (its weight moved into a new buffer
with them) or the adapters' rank grew (wider matmuls).

An engine with an EAGLE head (runtime/native/speculative/eagle.py) reads each step's final hidden states: built
with `keep_hidden`, every graph also copies them into one static [max_rows, hidden] buffer, handed out with the
logits.

All graphs share one memory pool and are captured largest first, so they cost about one graph's
activations. The KV cache tensors must not be reallocated afterwards (their addresses are baked in).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from runtime.native.attention_metadata import AttentionMetadata
from runtime.native.cuda.step_io import GreedyIds, load_step_inputs
from runtime.native.decode_rows import (
    ADAPTERS,
    LENGTHS,
    PACKED_ROWS,
    PADDING,
    POSITIONS,
    PREV,
    SLOTS,
    DecodeOutput,
    fit_rows,
    pack_rows,
)
from runtime.native.device import record_now

if TYPE_CHECKING:
    from runtime.native.block_tables import BlockTables
    from runtime.native.lora.apply import LoraBatch
    from runtime.native.models import CausalLM
    from runtime.native.step_inputs import StepInputs

logger = logging.getLogger(__name__)
SETS = 2  # graph sets replayed in turn (see the module docstring)
_PADDING = np.array(PADDING)[:, None]


def graph_batch_sizes(max_rows: int) -> list[int]:
    """Buckets: 1, 2, 3, 4, 8, then every 8 up to 64, every 16 up to 128, every 32 beyond; max_rows last.

    Padding costs at most 1/8 of the batch past 8 rows (decode time grows slowly with the batch),
    while the number of graphs (capture time, and host memory for their nodes) stays small. 3: a verification of
    the default 2 drafts, whose GEMVs of 3 tokens cost 0.76 ms on the default model against 0.95 ms for 4
    (runtime/native/cuda/gemv.py).
    """
    sizes = [s for s in (1, 2, 3, 4) if s < max_rows]
    size = 8
    while size < max_rows:
        sizes.append(size)
        size += 8 if size < 64 else 16 if size < 128 else 32
    sizes.append(max_rows)
    return sizes


def pick_bucket(sizes: Sequence[int], batch: int) -> int | None:
    """The smallest bucket that holds `batch` rows (sizes ascending); None when none does."""
    for size in sizes:
        if size >= batch:
            return size
    return None


def row_metadata(packed: torch.Tensor, tables: torch.Tensor, query_start: torch.Tensor, block_size: int,
                 max_seq_len: int) -> AttentionMetadata:
    """Attention metadata of packed rows: every row a one-token "sequence" with its own length and table."""
    rows = packed.shape[1]
    seq_lens = packed[LENGTHS]
    return AttentionMetadata(
        query_start_loc=query_start,
        context_lens=seq_lens,  # unread by the decode kernel
        seq_lens=seq_lens,
        block_tables=tables,
        slot_mapping=packed[SLOTS],
        block_size=block_size,
        max_query_len=1,
        max_seq_len=max_seq_len,
        query_lens_host=[1] * rows,
        seq_lens_host=[max_seq_len] * rows,
    )


@torch.inference_mode()
def capture_buckets(sizes: Sequence[Any], forward: Callable[[Any], object],
                    pool: Any = None) -> tuple[dict[Any, torch.cuda.CUDAGraph], Any]:
    """One graph of `forward(bucket)` per bucket (an int, or a tuple of them), largest first, all in one memory
    pool (`pool`, or a new one), so that together they cost about one graph's activations; returns them and the
    pool. Each bucket runs once before its capture (kernel compilation and library handles happen outside the
    graph)."""
    graphs = {}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for bucket in sorted(sizes, reverse=True):
            forward(bucket)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                forward(bucket)
            pool = graph.pool()
            graphs[bucket] = graph
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    return graphs, pool


class DecodeGraphs:
    """Captured decode-shaped steps of `model` over `kv_caches` (see the module docstring)."""

    def __init__(self, model: CausalLM, kv_caches: list[torch.Tensor], block_size: int, max_rows: int,
                 max_blocks_per_seq: int, lora: LoraBatch | None = None,
                 lora_version: Callable[[], int] = lambda: 0, keep_hidden: bool = False) -> None:
        device = kv_caches[0].device
        self.model, self.kv_caches, self.block_size = model, kv_caches, block_size
        self.max_blocks = max_blocks_per_seq
        self.sizes = graph_batch_sizes(max_rows)
        self.max_rows = max_rows
        # the packed rows (int64, as pairs of int32) then the block tables, in one buffer: one kernel fills it per step
        self.width = 2 * PACKED_ROWS * max_rows
        self.inputs = torch.zeros(self.width + max_rows * max_blocks_per_seq, dtype=torch.int32, device=device)
        self.packed = self.inputs[: self.width].view(torch.int64).view(PACKED_ROWS, max_rows)
        self.tables = self.inputs[self.width :].view(max_rows, max_blocks_per_seq)
        self.sampled = torch.zeros(max_rows, dtype=torch.long, device=device)  # the last graph's greedy ids
        self.ids = torch.zeros(max_rows, dtype=torch.long, device=device)  # each row's token, resolved
        vocab = model.spec.vocab_size  # (under tensor parallelism the output embedding holds a slice of it)
        self.greedy = GreedyIds(max_rows, vocab, device)
        # per graph set: pinned inputs, pinned greedy ids, and an event recorded after its last replay
        self.host_inputs = [torch.zeros_like(self.inputs, device="cpu").pin_memory() for _ in range(SETS)]
        self.host_sampled = [torch.zeros_like(self.sampled, device="cpu").pin_memory() for _ in range(SETS)]
        self.replayed = [torch.cuda.Event() for _ in range(SETS)]
        self.turn = 0
        self.query_start = torch.arange(max_rows + 1, dtype=torch.int32, device=device)
        # one output buffer for every graph: [max_rows, vocab] float32 once, not once per bucket and set
        self.logits = torch.empty((max_rows, vocab), dtype=torch.float32, device=device)
        self.keep_hidden = keep_hidden
        self.hidden: torch.Tensor | None = None  # [max_rows, hidden]: allocated by the first forward, before capture
        self.lora, self.lora_version = lora, lora_version
        self.pool = None
        self.captured_version = lora_version()
        self.base = self._capture_all(with_lora=False)
        self.with_lora: list[dict[int, torch.cuda.CUDAGraph]] = []

    @property
    def hands_out_hidden(self) -> bool:
        """Whether DecodeOutput.hidden holds each row's final hidden state (what an EAGLE head reads)."""
        return self.keep_hidden

    def meta(self, bucket: int) -> AttentionMetadata:
        return row_metadata(self.packed[:, :bucket], self.tables[:bucket], self.query_start[: bucket + 1],
                            self.block_size, self.max_blocks * self.block_size)

    def load(self, bucket: int, turn: int) -> None:
        """In a graph: copy set `turn`'s pinned rows to the device and resolve each row's token into `ids`."""
        end = self.width + bucket * self.max_blocks  # the packed rows and the bucket's block tables
        load_step_inputs(self.host_inputs[turn], self.inputs, end, self.sampled, self.ids, bucket, self.max_rows)

    def _forward(self, bucket: int, turn: int, meta: AttentionMetadata) -> None:
        self.load(bucket, turn)
        hidden = self.model(self.ids[:bucket], self.packed[POSITIONS, :bucket], self.kv_caches, meta)
        if self.keep_hidden:
            if self.hidden is None:  # (the warm-up forward of the largest bucket, outside any capture)
                self.hidden = hidden.new_empty((self.max_rows, hidden.shape[1]))
            self.hidden[:bucket].copy_(hidden)
        logits = self.model.compute_logits(hidden, out=self.logits[:bucket])
        self.greedy(logits, self.sampled, self.host_sampled[turn])

    def _capture_all(self, with_lora: bool) -> list[dict[int, torch.cuda.CUDAGraph]]:
        started = time.perf_counter()
        kept = self.pad_for_capture()
        if self.lora is not None:
            self.lora.clear()  # a base capture must not record the hooks of the last eager adapter step
        sets = []
        for turn in range(SETS):
            def forward(bucket: int, turn: int = turn) -> None:
                if with_lora:
                    self.lora.bind(self.packed[ADAPTERS, :bucket])  # type: ignore[union-attr]
                self._forward(bucket, turn, self.meta(bucket))

            graphs, self.pool = capture_buckets(self.sizes, forward, self.pool)
            sets.append(graphs)
        if self.lora is not None:
            self.lora.clear()
        self.restore(kept)
        logger.info("CUDA graphs: captured %d decode row counts (%s)%s, %d sets, in %.1f s", len(self.sizes),
                    ",".join(map(str, self.sizes)), " with LoRA" if with_lora else "", SETS,
                    time.perf_counter() - started)
        return sets

    def pad_for_capture(self) -> list[torch.Tensor]:
        """Before a capture: every row of both sets padding, so the warm-up forwards store nothing; returns the
        sampled ids to `restore` after it (a capture while serving, for LoRA, comes between launching a step and
        collecting it, and the warm-ups overwrite them: the ids that step produced for its host and the next
        step)."""
        torch.cuda.synchronize()  # no replay is reading the host buffers
        kept = [self.sampled.clone(), *(h.clone() for h in self.host_sampled)]
        for turn in range(SETS):
            packed, _ = self.host_views(turn)
            packed[:] = _PADDING
        return kept

    def restore(self, kept: list[torch.Tensor]) -> None:
        for buffer, saved in zip((self.sampled, *self.host_sampled), kept):
            buffer.copy_(saved)

    def accepts(self, inputs: StepInputs) -> bool:
        """Every input brings at most MAX_ROWS_PER_SEQ tokens, all rows fit a bucket, tables fit the buffer."""
        return (fit_rows(inputs, self.max_blocks) and len(inputs.token_ids) <= self.sizes[-1]
                and (self.lora is not None or max(inputs.adapter_slots) < 0))

    def run(self, inputs: StepInputs, last_sampled: torch.Tensor | None,
            resident: BlockTables | None = None) -> DecodeOutput:
        """Replay the bucket's graph: float32 logits [new tokens, vocab] and each row's greedy id, on the device
        (both valid until the next run) and in pinned host memory (valid until the run after next; read it
        once the step has run). `last_sampled`: the previous launch's sampled ids, on the device; `resident`: the
        block tables the inputs name rows of (pack_rows)."""
        return self.replay(*pack_rows(inputs, self.block_size, resident), last_sampled)

    def replay(self, columns: np.ndarray, tables: np.ndarray, last_sampled: torch.Tensor | None) -> DecodeOutput:
        """`run` for rows packed already (pack_rows): what the other tensor-parallel ranks replay too."""
        n = tables.shape[0]
        bucket = pick_bucket(self.sizes, n)
        assert bucket is not None
        turn = self.turn
        # may capture: before inputs are written
        graph = self._graphs(bool(columns[ADAPTERS].max() >= 0))[turn][bucket]
        self.stage(columns, tables, bucket, last_sampled)
        graph.replay()
        self.replayed_now()
        hidden = self.hidden[:n] if self.hidden is not None else None
        return DecodeOutput(self.logits[:n], self.sampled[:n], self.host_sampled[turn][:n], hidden)

    def stage(self, columns: np.ndarray, tables: np.ndarray, bucket: int, last_sampled: torch.Tensor | None) -> None:
        """Write packed rows (pack_rows) into the current set's pinned inputs, padded to `bucket`, once that set's
        last replay has read them; and the previous launch's samples where a graph reads pending tokens."""
        if (last_sampled is not None and last_sampled.data_ptr() != self.sampled.data_ptr()
                and columns[PREV].max() >= 0):  # the sampler chose them, not a graph's argmax
            self.sampled[: last_sampled.shape[0]].copy_(last_sampled)
        self.replayed[self.turn].synchronize()  # this set's last replay has read its inputs (at once when recorded)
        packed, host_tables = self.host_views(self.turn)
        n = tables.shape[0]
        packed[:, :n] = columns
        packed[:, n:bucket] = _PADDING
        host_tables[:n, : tables.shape[1]] = tables  # later columns are never read (past the lengths)

    def replayed_now(self) -> None:
        """After replaying a graph of the current set: the next step uses the other set."""
        record_now(self.replayed[self.turn], self.inputs)
        self.turn = (self.turn + 1) % SETS

    def host_views(self, turn: int) -> tuple[np.ndarray, np.ndarray]:
        """Graph set `turn`'s pinned inputs as numpy views: the packed rows [PACKED_ROWS, max_rows] (int64) and
        the block tables [max_rows, max_blocks] (int32)."""
        host = self.host_inputs[turn].numpy()
        return (host[: self.width].view(np.int64).reshape(PACKED_ROWS, self.max_rows),
                host[self.width :].reshape(self.max_rows, self.max_blocks))

    def _graphs(self, with_lora: bool) -> list[dict[int, torch.cuda.CUDAGraph]]:
        version = self.lora_version()
        if version != self.captured_version:
            # a Linear got adapter stacks, which moves its weight into a new buffer (runtime/native/lora/slots.py),
            # or a wider adapter rank: every graph holds stale addresses or shapes
            self.base = self.with_lora = []  # free them before capturing their replacements
            self.base = self._capture_all(with_lora=False)
            self.captured_version = version
        if with_lora and not self.with_lora:  # the first adapter step since
            self.with_lora = self._capture_all(with_lora=True)
        return self.with_lora if with_lora else self.base
