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
weights are never modified. Those two are the CPU product. On CUDA every hooked Linear instead runs two
Triton kernels (runtime/cuda/lora_kernels.py) that gather each token's slot from `token_slots`, over all
`cap` ranks: nothing depends on Python-side state of the step, so CUDA graphs replay them (`bind`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from runtime.lora.slots import LinearSlots

# All-slots product while r * S stays under this many columns, or the step is decode-sized.
DENSE_COLUMNS = 256
DENSE_TOKENS = 64


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
        self.token_slots = torch.tensor(per_token, dtype=torch.long).to(self.device, non_blocking=True)
        if self.cuda:  # the kernels need nothing else
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
    """The Linear.delta hook of one adaptable Linear: y + per-token low-rank updates."""

    def __init__(self, batch: LoraBatch, stacks: LinearSlots) -> None:
        self.batch = batch
        self.stacks = stacks
        self.kernels: Callable[..., torch.Tensor] | None = None
        if stacks.a.is_cuda:
            from runtime.cuda.lora_kernels import lora_shrink_expand  # Triton is needed on CUDA only

            self.kernels = lora_shrink_expand

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        batch = self.batch
        if not batch.active:
            return y
        a, b = self.stacks.a, self.stacks.b  # [cap, S, in], [cap, S, out]
        if self.kernels is not None:  # CUDA
            return self.kernels(x, y, a, b, batch.token_slots, self.stacks.device_ranks)
        rank = self.stacks.used_rank
        if rank == 0:
            return y
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
