"""CUDA graphs for steps that prefill one sequence: one graph per prompt-length bucket.

Why: a 1,024-token prefill of Llama-3.2-1B is 4 ms of kernels on an H100/H200, but launched one by one from
Python (about 160 kernels, a third of them through Triton's launcher) the step took 8-16 ms of host time,
and how long varied from moment to moment with the lent VM's CPU. Replayed from a graph the step costs one
launch, so time to first token follows the GPU, not the host.

A graphed step is one sequence bringing more new tokens than a decode graph takes (runtime/cuda/graphs.py)
and at most the largest bucket: a whole prompt or a chunk of one, over any cached context, on the base
model, sampling from its last token only. Its tokens are padded to the bucket: padded tokens get KV slot
-1 (nothing stored), and the prefill kernel skips query tiles past the sequence's real tokens (their rows
are never read: projections and norms are row by row, and attention reads keys from the cache). The last
real token's hidden state is selected on the device, so every graph writes one row of float32 logits.

Inputs come from one static int64 buffer, written by one host-to-device copy per step: token ids,
positions and KV slots (the largest bucket's rows each; a graph reads its bucket's first rows), then the
context length, the sequence length, the last real row, a 0 (where the sequence's queries start) and the
block table. Graphs are captured again when `lora_version` changes (a Linear's weight moved into a new
buffer with adapter stacks); steps with an adapter run eagerly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from runtime.attention_metadata import AttentionMetadata
from runtime.cuda.graphs import capture_buckets, pick_bucket
from runtime.cuda.paged_attention import PREFILL_BLOCK_M
from runtime.decode_rows import MAX_ROWS_PER_SEQ
from runtime.device import PinnedStaging

if TYPE_CHECKING:
    from runtime.lora.apply import LoraBatch
    from runtime.model_runner import StepInput
    from runtime.models import CausalLM

logger = logging.getLogger(__name__)

MAX_PREFILL_GRAPH_TOKENS = 4096  # past this the launches are a small share of the step (and graphs cost memory)


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


class PrefillGraphs:
    """Captured single-sequence prefill steps of `model` over `kv_caches` (see the module docstring)."""

    def __init__(self, model: CausalLM, kv_caches: list[torch.Tensor], block_size: int, max_tokens: int,
                 max_blocks_per_seq: int, lora: LoraBatch | None = None,
                 lora_version: Callable[[], int] = lambda: 0) -> None:
        device = kv_caches[0].device
        self.model, self.kv_caches, self.block_size = model, kv_caches, block_size
        self.max_blocks = max_blocks_per_seq
        self.sizes = prefill_bucket_sizes(min(max_tokens, MAX_PREFILL_GRAPH_TOKENS))
        self.rows = self.sizes[-1]  # ids at [0, rows), positions at [rows, 2 rows), slots at [2 rows, 3 rows), ...
        self.buffer = torch.zeros(3 * self.rows + 4 + max_blocks_per_seq, dtype=torch.long, device=device)
        self.staging = PinnedStaging(tuple(self.buffer.shape), self.buffer.dtype)
        # every query tile of the bucket: fixed per graph, the kernel skips those past the real tokens
        self.tiles = {}
        for bucket in self.sizes:
            offsets = torch.arange(0, bucket, PREFILL_BLOCK_M, dtype=torch.int32)
            self.tiles[bucket] = torch.stack((torch.zeros_like(offsets), offsets)).to(device)
        self.logits = torch.empty((1, model.output_embedding().shape[0]), dtype=torch.float32, device=device)
        self.lora, self.lora_version = lora, lora_version
        self.captured_version = lora_version()
        self.pool = None
        self.graphs = self._capture()

    def _forward(self, bucket: int) -> None:
        rows = self.rows
        ids, positions, slots = self.buffer[: 3 * rows].view(3, rows)[:, :bucket]
        scalars = self.buffer[3 * rows: 3 * rows + 4]  # context length, sequence length, last real row, 0
        meta = AttentionMetadata(
            query_start_loc=scalars[3:],  # the one sequence starts at row 0 (the kernel reads only [0])
            context_lens=scalars[0:1],
            seq_lens=scalars[1:2],
            block_tables=self.buffer[3 * rows + 4:].view(1, -1),
            slot_mapping=slots,
            block_size=self.block_size,
            max_query_len=bucket,
            max_seq_len=self.max_blocks * self.block_size,
            query_lens_host=[bucket],
            seq_lens_host=[self.max_blocks * self.block_size],
        )
        meta.derived["triton_prefill_tiles"] = self.tiles[bucket]
        hidden = self.model(ids, positions, self.kv_caches, meta)
        self.model.compute_logits(hidden.index_select(0, scalars[2:3]), out=self.logits)

    def _capture(self) -> dict[int, torch.cuda.CUDAGraph]:
        started = time.perf_counter()
        self.buffer.zero_()
        self.buffer[2 * self.rows: 3 * self.rows].fill_(-1)  # capture with every row padding: the warm-ups store nothing
        if self.lora is not None:
            self.lora.clear()  # a base capture must not record the hooks of the last eager adapter step
        graphs, self.pool = capture_buckets(self.sizes, self._forward, self.pool)
        logger.info("CUDA graphs: captured %d prefill lengths (%s) in %.1f s", len(self.sizes),
                    ",".join(map(str, self.sizes)), time.perf_counter() - started)
        return graphs

    def accepts(self, inputs: Sequence[StepInput]) -> bool:
        """One sequence on the base model, more tokens than a decode graph takes and no more than the largest
        bucket, logits of its last token at most."""
        if len(inputs) != 1:
            return False
        inp = inputs[0]
        return (MAX_ROWS_PER_SEQ < len(inp.token_ids) <= self.rows and inp.adapter_slot < 0
                and not inp.return_all_logits and inp.prev_sample < 0 and len(inp.block_table) <= self.max_blocks)

    def run(self, inputs: Sequence[StepInput]) -> torch.Tensor:
        """Replay the bucket's graph; float32 logits [1, vocab] of the last token (valid until the next run)."""
        version = self.lora_version()
        if version != self.captured_version:
            self.graphs = {}  # free them before capturing their replacements
            self.graphs = self._capture()
            self.captured_version = version
        inp = inputs[0]
        n, start, bs = len(inp.token_ids), inp.start_pos, self.block_size
        bucket = pick_bucket(self.sizes, n)
        assert bucket is not None
        rows = self.rows
        table = np.asarray(inp.block_table, dtype=np.int64)
        positions = np.arange(start, start + n, dtype=np.int64)
        staged = self.staging.take()
        host = staged.numpy()[: 3 * rows + 4 + len(table)]  # 49 kB at 2,048 rows: a few microseconds to copy
        host[:n] = inp.token_ids
        host[n:rows] = 0
        host[rows: rows + n] = positions
        host[rows + n: 2 * rows] = 0
        host[2 * rows: 3 * rows] = -1
        host[2 * rows: 2 * rows + n] = table[positions // bs] * bs + positions % bs
        host[3 * rows: 3 * rows + 4] = (start, start + n, n - 1, 0)
        host[3 * rows + 4:] = table
        self.staging.copy(self.buffer[: host.size], staged[: host.size])
        self.graphs[bucket].replay()
        return self.logits
