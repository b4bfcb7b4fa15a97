"""A decode graph's first and last kernels: its inputs read from pinned host memory, its greedy ids written there.

Why kernels and not copies: on the H200 the device sat idle 8-13 us between a host-to-device copy and the kernel
after it, and 8 us on either side of a device-to-host copy, inside a CUDA graph as on the stream (the copy
engine hands over to the compute engine): about 30 us of a 1.1 ms batch-1 decode step. A kernel reads pinned
host memory directly (with unified addressing a pinned host buffer has a device address), so the step's input
arrives with its first kernel and its ids leave with its last.

- `load_step_inputs`: copies the packed rows and block tables (runtime/native/cuda/graphs.py) from the pinned buffer
  to the device, and resolves each row's token id: its own, or, for a row whose token the previous step
  sampled on the device, that step's id (`sampled[prev]`).
- `greedy_ids`: argmax of each row's logits in two passes (a row of 128k logits is split over CHUNKS
  programs; one program per row, as torch's reduction does, took 27 us), written to `sampled` on the device
  and to a pinned host buffer. Ties go to the lowest index, as in torch.argmax.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from runtime.native.decode_rows import IDS, PREV

LOAD_BLOCK = 1024
CHUNKS = 64  # programs per row in the argmax's first pass


@triton.jit
def _load_step_inputs_kernel(src_ptr, dst_ptr, count, packed_ptr, sampled_ptr, ids_ptr, rows, max_rows,
                             IDS_ROW: tl.constexpr, PREV_ROW: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < count
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=inside), mask=inside)
    row = offs  # this program also resolves the ids of the rows with its offsets (count >= 2 * 6 * max_rows)
    real = row < rows
    token = tl.load(packed_ptr + IDS_ROW * max_rows + row, mask=real, other=0)
    prev = tl.load(packed_ptr + PREV_ROW * max_rows + row, mask=real, other=-1)
    pending = tl.load(sampled_ptr + tl.maximum(prev, 0), mask=real & (prev >= 0), other=0)
    tl.store(ids_ptr + row, tl.where(prev >= 0, pending, token), mask=real)


def load_step_inputs(host: torch.Tensor, device: torch.Tensor, count: int, sampled: torch.Tensor,
                     ids: torch.Tensor, rows: int, max_rows: int) -> None:
    """device[:count] = host[:count] (int32; host pinned, or on the device), and ids[:rows] = each row's token:
    packed IDS, or sampled[PREV] where PREV >= 0 (packed: host[: 12 * max_rows] as int64 [6, max_rows])."""
    packed = host[: 2 * 6 * max_rows].view(torch.int64)
    _load_step_inputs_kernel[(triton.cdiv(count, LOAD_BLOCK),)](
        host, device, count, packed, sampled, ids, rows, max_rows, IDS_ROW=IDS, PREV_ROW=PREV, BLOCK=LOAD_BLOCK)


@triton.jit
def _chunk_argmax_kernel(x_ptr, stride, vocab, best_ptr, where_ptr, CHUNKS: tl.constexpr, WIDTH: tl.constexpr,
                         BLOCK: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    start = chunk * WIDTH
    best = tl.full((), float("-inf"), tl.float32)
    where = tl.full((), 0, tl.int32) + start
    for off in range(0, WIDTH, BLOCK):
        cols = start + off + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
        block_best = tl.max(x, 0)
        block_where = tl.argmax(x, 0, tie_break_left=True) + start + off
        better = block_best > best  # ties keep the earlier block's
        where = tl.where(better, block_where, where)
        best = tl.where(better, block_best, best)
    tl.store(best_ptr + row * CHUNKS + chunk, best)
    tl.store(where_ptr + row * CHUNKS + chunk, where)


@triton.jit
def _final_argmax_kernel(best_ptr, where_ptr, sampled_ptr, host_ptr, CHUNKS: tl.constexpr):
    row = tl.program_id(0)
    chunks = tl.arange(0, CHUNKS)
    best = tl.load(best_ptr + row * CHUNKS + chunks)
    where = tl.load(where_ptr + row * CHUNKS + chunks)
    first = tl.argmax(best, 0, tie_break_left=True)
    token = tl.sum(tl.where(chunks == first, where, 0), 0).to(tl.int64)
    tl.store(sampled_ptr + row, token)
    tl.store(host_ptr + row, token)


class GreedyIds:
    """Scratch for `rows` x `vocab` argmaxes; `__call__` writes each row's argmax to `sampled` and `host`."""

    def __init__(self, max_rows: int, vocab: int, device: torch.device) -> None:
        self.vocab = vocab
        width = triton.cdiv(vocab, CHUNKS)
        self.block = min(LOAD_BLOCK, triton.next_power_of_2(width))
        self.width = triton.cdiv(width, self.block) * self.block
        self.best = torch.empty(max_rows * CHUNKS, dtype=torch.float32, device=device)
        self.where = torch.empty(max_rows * CHUNKS, dtype=torch.int32, device=device)

    def __call__(self, logits: torch.Tensor, sampled: torch.Tensor, host: torch.Tensor) -> None:
        rows = logits.shape[0]
        _chunk_argmax_kernel[(rows, CHUNKS)](logits, logits.stride(0), self.vocab, self.best, self.where,
                                             CHUNKS=CHUNKS, WIDTH=self.width, BLOCK=self.block)
        _final_argmax_kernel[(rows,)](self.best, self.where, sampled, host, CHUNKS=CHUNKS)
