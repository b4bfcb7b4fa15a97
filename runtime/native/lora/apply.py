"""Batched LoRA in the forward pass: per-token slot indices and the Linear delta hook.

The model runner describes each step once (`LoraBatch.set`: how many tokens each sequence computes and
its slot, -1 for the base model); every hooked Linear then adds, for the tokens that have an adapter,
B[slot] A[slot] x. Two ways, same result:
- all slots at once (the usual case): h = x A_all^T over the [r * S, in] stack of every slot's first r
  ranks, zero the columns of other slots with the token's one-hot slot mask, d = h B_all. Two matmuls
  and a multiply per Linear whatever the mix of adapters, shapes fixed by (tokens, r, S);
- one pair of matmuls per distinct slot over its tokens, when r * S is large and the step has many
  tokens (long prefills with high-rank adapters), where the all-slots product would waste FLOPs.
Either way requests with different adapters and the base model share one forward pass, and the base
weights are never modified. Those two are the CPU product. On CUDA the slots' A sits under the base
weight (runtime/native/lora/slots.py): one matmul gives the base output and every slot's h = x A^T, then one
Triton kernel per Linear (runtime/native/cuda/lora_kernels.py) adds each token's own slot's h B, reading the
slot from `token_slots` on the device; nothing depends on Python-side state of the step, so CUDA
graphs replay it (`bind`). Steps of many tokens take the masked all-slots product instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from runtime.native.device import host_tensor
from runtime.native.lora.slots import LinearSlots
from runtime.native.models.linear import Linear

# CPU: all-slots product while r * S stays under this many columns, or the step is decode-sized.
DENSE_COLUMNS = 256
DENSE_TOKENS = 64
# CUDA: the gathered expand kernel up to this many tokens, the masked all-slots product beyond. The
# kernel reads each token's B[slot] apart (T x r x out, from L2) but is one launch; the product reads B
# once but costs three more ops of host time, which a step of a few hundred tokens is bound by (H100,
# 1B, 8 x 64-token prefill: 1.39x the base step with the kernel, 1.63x with the product)
EXPAND_TOKENS = 1024


class LoraBatch:
    """The current step's token -> slot mapping, shared by every hooked Linear."""

    def __init__(self, num_slots: int, device: torch.device, dtype: torch.dtype) -> None:
        self.num_slots = num_slots
        self.device, self.dtype = device, dtype
        self.active = False
        self.cuda = device.type == "cuda"
        self.token_slots = torch.empty(0, dtype=torch.long, device=device)  # [tokens]: slot, -1 for none
        self.rows: torch.Tensor | None = None  # tokens with an adapter; None: every token has one
        self.onehot = torch.empty(0, num_slots, dtype=dtype)  # [rows, S]: 1 at each row's slot
        self.num_rows = 0
        self.segments: list[tuple[int, torch.Tensor]] = []  # (slot, token indices), built on demand
        self._slot_mask: torch.Tensor | None = None
        self._rows_list: list[int] = []
        self._slots_list: list[int] = []

    def set(self, token_counts: Sequence[int], slots: Sequence[int]) -> None:
        """Describe the step: sequence i computes token_counts[i] tokens with adapter slot slots[i]."""
        self.active = any(s >= 0 for s in slots)
        self.segments = []
        if not self.active:
            return
        per_token = [s for n, s in zip(token_counts, slots) for _ in range(n)]
        # non_blocking: no stream sync on CUDA (the pageable source is staged before the call returns)
        self.token_slots = host_tensor(per_token, torch.long, self.device)
        self._slot_mask = None
        if self.cuda:  # the CUDA path reads nothing else
            return
        rows: list[int] = []
        row_slots: list[int] = []
        start = 0
        for n, s in zip(token_counts, slots):
            if s >= 0:
                rows.extend(range(start, start + n))
                row_slots.extend([s] * n)
            start += n
        self._rows_list, self._slots_list = rows, row_slots
        self.num_rows = len(rows)
        self.rows = None if len(rows) == start else torch.tensor(rows, dtype=torch.long, device=self.device)
        index = torch.tensor(row_slots, dtype=torch.long, device=self.device)
        self.onehot = torch.nn.functional.one_hot(index, self.num_slots).to(self.dtype)

    def bind(self, token_slots: torch.Tensor) -> None:
        """For CUDA graph capture: every step reads its slots from this static int64 [rows] tensor (-1: none)."""
        self.active = True
        self.rows = None
        self.token_slots = token_slots
        self._slot_mask = None

    def slot_mask(self) -> torch.Tensor:
        """[tokens, S] one-hot of each token's slot (zeros for -1), computed on the device from
        `token_slots` by the step's first Linear and shared by the others."""
        if self._slot_mask is None:
            slots = torch.arange(self.num_slots, device=self.token_slots.device)
            self._slot_mask = (self.token_slots[:, None] == slots).to(self.dtype)
        return self._slot_mask

    def clear(self) -> None:
        self.active = False

    def by_slot(self) -> list[tuple[int, torch.Tensor]]:
        """(slot, token indices) per distinct slot; built on first use in a step."""
        if not self.segments:
            groups: dict[int, list[int]] = {}
            for row, slot in zip(self._rows_list, self._slots_list):
                groups.setdefault(slot, []).append(row)
            self.segments = [(s, torch.tensor(r, dtype=torch.long, device=self.device)) for s, r in groups.items()]
        return self.segments


class LoraDelta:
    """The Linear.delta hook of one adaptable Linear: its projection plus per-token low-rank updates."""

    def __init__(self, batch: LoraBatch, stacks: LinearSlots) -> None:
        self.batch = batch
        self.stacks = stacks
        self.expand: Callable[..., torch.Tensor] | None = None
        if batch.cuda:  # A folded under the base weight (runtime/native/lora/slots.py), or beside an FP8 one
            from runtime.native.cuda.lora_kernels import (
                lora_expand,  # Triton is needed on CUDA only
            )

            self.expand = lora_expand

    def __call__(self, x: torch.Tensor, linear: Linear) -> torch.Tensor:
        if not self.batch.active:
            return linear.base(x)
        if self.expand is not None:
            return self._folded(x, linear)
        return self._add_updates(x, linear.base(x))

    def _folded(self, x: torch.Tensor, linear: Linear) -> torch.Tensor:
        """CUDA: one matmul over [W; A_all] gives y and h_all (an FP8 W: its own product, h_all beside it); then
        the gathered expand kernel (decode sizes), or the all-slots product masked by each token's slot (many
        tokens: it reads B once)."""
        stacks, batch = self.stacks, self.batch
        out, rank, slots = stacks.out_features, stacks.matmul_rank, stacks.num_slots
        width = out + rank * slots
        if stacks.weight is None:
            y = linear.base(x)
            if rank == 0:
                return y
            y_ext = torch.cat((y, F.linear(x, stacks.a[:rank].reshape(rank * slots, -1))), dim=1)
        else:
            y_ext = F.linear(x, stacks.weight[:width], None if stacks.bias is None else stacks.bias[:width])
        if rank == 0:  # no adapter touches this Linear yet
            return y_ext
        if x.shape[0] <= EXPAND_TOKENS:
            return self.expand(y_ext, stacks.b, batch.token_slots, stacks.device_ranks)  # type: ignore[misc]
        h = (y_ext[:, out:].view(-1, rank, slots) * batch.slot_mask()[:, None, :]).view(-1, rank * slots)
        return torch.addmm(y_ext[:, :out], h, stacks.b[:rank].reshape(rank * slots, out))

    def _add_updates(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """CPU: y + the updates, by the all-slots or the per-slot product (see the module docstring)."""
        batch = self.batch
        rank = self.stacks.used_rank
        if rank == 0:
            return y
        a, b = self.stacks.a, self.stacks.b  # [cap, S, in], [cap, S, out]
        slots = a.shape[1]
        if rank * slots <= DENSE_COLUMNS or batch.num_rows <= DENSE_TOKENS:
            xs = x if batch.rows is None else x.index_select(0, batch.rows)
            h = xs @ a[:rank].reshape(rank * slots, -1).T  # [n, r * S], column = rank * S + slot
            h = (h.view(-1, rank, slots) * batch.onehot[:, None, :]).view(-1, rank * slots)
            b_all = b[:rank].reshape(rank * slots, -1)  # [r * S, out], a view
            if batch.rows is None:
                return y.addmm_(h, b_all)  # one fused kernel for y += h B_all
            return y.index_add_(0, batch.rows, h @ b_all)
        for slot, rows in batch.by_slot():
            d = (x.index_select(0, rows) @ a[:rank, slot].T) @ b[:rank, slot]
            y.index_add_(0, rows, d)
        return y
