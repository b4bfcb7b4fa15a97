"""CUDA graphs for decode steps: one graph per batch-size bucket, replayed with the batch padded.

Why: a decode step launches hundreds of small kernels; launched one by one from Python the step is
bound by the host. A captured graph replays them with one launch.

Each graph reads its inputs from static buffers: input ids, positions, slot mapping and sequence
lengths packed in one int64 [4, max_batch] tensor (one host-to-device copy per step), and the block
tables in an int32 [max_batch, max_blocks] tensor (a second copy of only the columns in use). Padded
rows get slot -1 (their K/V is not stored) and length 0 (attention returns zeros), so they touch
nothing. The graph's output is float32 logits [bucket, vocab], one row per sequence.

All graphs share one memory pool and are captured largest first, so they cost about one graph's
activations. The KV cache tensors must not be reallocated afterwards (their addresses are baked in).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from runtime.attention_metadata import AttentionMetadata

if TYPE_CHECKING:
    from runtime.model_runner import StepInput
    from runtime.models import CausalLM

logger = logging.getLogger(__name__)


def graph_batch_sizes(max_batch_size: int) -> list[int]:
    """Buckets: 1, 2, 4, 8, then every 8 up to 64, every 16 up to 128, every 32 beyond; max_batch_size last.

    Padding costs at most 1/8 of the batch past 8 rows (decode time grows slowly with the batch),
    while the number of graphs (capture time, and host memory for their nodes) stays small.
    """
    sizes = [s for s in (1, 2, 4) if s < max_batch_size]
    size = 8
    while size < max_batch_size:
        sizes.append(size)
        size += 8 if size < 64 else 16 if size < 128 else 32
    sizes.append(max_batch_size)
    return sizes


def pick_bucket(sizes: Sequence[int], batch: int) -> int | None:
    """The smallest bucket that holds `batch` rows (sizes ascending); None when none does."""
    for size in sizes:
        if size >= batch:
            return size
    return None


class DecodeGraphs:
    """Captured decode steps of `model` over `kv_caches` (see the module docstring)."""

    def __init__(self, model: CausalLM, kv_caches: list[torch.Tensor], block_size: int,
                 max_batch_size: int, max_blocks_per_seq: int) -> None:
        device = kv_caches[0].device
        self.model, self.kv_caches, self.block_size = model, kv_caches, block_size
        self.max_blocks = max_blocks_per_seq
        self.sizes = graph_batch_sizes(max_batch_size)
        self.packed = torch.zeros((4, max_batch_size), dtype=torch.long, device=device)
        self.packed[2].fill_(-1)  # slots: store nothing
        self.tables = torch.zeros((max_batch_size, max_blocks_per_seq), dtype=torch.int32, device=device)
        self.query_start = torch.arange(max_batch_size + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        started = time.perf_counter()
        self._capture_all()
        logger.info("CUDA graphs: captured %d decode batch sizes (%s) in %.1f s",
                    len(self.sizes), ",".join(map(str, self.sizes)), time.perf_counter() - started)

    def _meta(self, bucket: int) -> AttentionMetadata:
        seq_lens = self.packed[3, :bucket]
        return AttentionMetadata(
            query_start_loc=self.query_start[: bucket + 1],
            context_lens=seq_lens,  # unread by the decode kernel
            seq_lens=seq_lens,
            block_tables=self.tables[:bucket],
            slot_mapping=self.packed[2, :bucket],
            block_size=self.block_size,
            max_query_len=1,
            max_seq_len=self.max_blocks * self.block_size,
            query_lens_host=[1] * bucket,
            seq_lens_host=[self.max_blocks * self.block_size] * bucket,
        )

    def _forward(self, bucket: int, meta: AttentionMetadata) -> torch.Tensor:
        hidden = self.model(self.packed[0, :bucket], self.packed[1, :bucket], self.kv_caches, meta)
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool = None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for bucket in reversed(self.sizes):
                meta = self._meta(bucket)
                self._forward(bucket, meta)  # warm-up: kernel compilation and library handles outside the graph
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self.logits[bucket] = self._forward(bucket, meta)
                pool = graph.pool()
                self.graphs[bucket] = graph
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()

    def accepts(self, inputs: Sequence[StepInput]) -> bool:
        """A plain decode step: one new token and one logits row per sequence, no adapter, fits a bucket."""
        return (
            len(inputs) <= self.sizes[-1]
            and all(len(i.token_ids) == 1 and i.sample_rows and not i.return_all_logits and i.adapter_slot < 0
                    and len(i.block_table) <= self.max_blocks for i in inputs)
        )

    def run(self, inputs: Sequence[StepInput]) -> torch.Tensor:
        """Replay the bucket's graph for `inputs`; float32 logits [len(inputs), vocab] (valid until the next run)."""
        n = len(inputs)
        bucket = pick_bucket(self.sizes, n)
        assert bucket is not None
        bs = self.block_size
        pad = bucket - n
        ids, pos, slots, lens = [], [], [], []
        width = 1
        for inp in inputs:
            p = inp.start_pos
            ids.append(inp.token_ids[0])
            pos.append(p)
            slots.append(inp.block_table[p // bs] * bs + p % bs)
            lens.append(p + 1)
            width = max(width, len(inp.block_table))
        host = torch.tensor([ids + [0] * pad, pos + [0] * pad, slots + [-1] * pad, lens + [0] * pad], dtype=torch.long)
        tables = torch.tensor([i.block_table + [0] * (width - len(i.block_table)) for i in inputs], dtype=torch.int32)
        self.packed[:, :bucket].copy_(host, non_blocking=True)
        self.tables[:n, :width].copy_(tables, non_blocking=True)
        self.graphs[bucket].replay()
        return self.logits[bucket][:n]
