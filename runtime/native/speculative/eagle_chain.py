"""EagleChain: an EAGLE head's whole proposal for one sequence, its catch-up and its chained drafts, in one CUDA graph.

Why: drafting op by op (eagle.py) costs about 40 launches from Python a chained token; on an H200 that was ~2.5 ms of
host a step with 2 drafts, against 0.53 ms for the default model's plain step (benchmarks/RESULTS.md, 2026-11-29
14:12-14:42). A graph needs fixed shapes and addresses, so here:
- the head's state of a sequence lives in one of a few static slots: the target's hidden states and the head's
  K/V by absolute position, up to `capacity` positions (eagle.py keeps the others' state, and drafts for them op by
  op);
- the catch-up is always the window of k+1 indices ending at the last verified one, clamped to the first position
  handed out (eagle.py computes any older ones op by op first); indices the window repeats are computed again from
  the same inputs;
- attention reads the slot's first `span` positions under a mask (from the first position handed out up to the
  query's), the span the smallest of powers of two from MIN_SPAN (and the capacity) that holds the chain: a graph
  per (k, span). Over the whole capacity of the default model's 8,192-position window, attention was 3/4 of a
  proposal: 1.23 ms of device time for 2 drafts against 0.40 ms over 256 positions (H200, 2026-11-29,
  benchmarks/eagle_chain_cost.py);
- each draft's argmax feeds the next chained step on the device, and the host reads the k drafts once.
Without a graph (no CUDA) the same forward runs op by op: the CPU tests check its drafts against eagle.py's path.
Drafts only decide what is verified, never what is emitted, so a difference in their last bits costs acceptance,
not exactness.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from runtime.native.models.base import CausalLM
from runtime.native.speculative.eagle_head import EagleHead, cached_rope

logger = logging.getLogger(__name__)

MIN_SPAN = 256  # the shortest window a chain's attention reads


class EagleChain:
    """Slots of head state and one proposal forward per number of drafts k, captured as a CUDA graph where `graphs`."""

    def __init__(self, head: EagleHead, target: CausalLM, slots: int, capacity: int, device: torch.device,
                 graphs: bool) -> None:
        self.head, self.target, self.capacity, self.graphs = head, target, capacity, graphs
        dtype = head.o_proj.weight.dtype
        width, kv, dim = head.o_proj.out_features, head.kv_heads, head.head_dim
        self.hidden = torch.zeros(slots, capacity, width, dtype=dtype, device=device)
        self.keys = torch.zeros(slots, kv, capacity, dim, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.free = list(range(slots))
        self.cos, self.sin = cached_rope(head, capacity, device, dtype)  # the table the op-by-op path reads too
        self.positions = torch.arange(capacity, device=device)
        self.spans = sorted({min(capacity, MIN_SPAN << i) for i in range(max(1, capacity // MIN_SPAN).bit_length())}
                            | {capacity})
        # per k: the inputs (slot, first position, last verified index, the window's next tokens) on the device and in
        # pinned host memory, and the drafts; per (k, span): the graph
        self._inputs: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    def views(self, slot: int, first: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Slot `slot`'s hidden states [capacity - first, H] and K/V [kv, capacity - first, D] from position `first`:
        the layout eagle.py's state indexes (position - first)."""
        return self.hidden[slot, first:], self.keys[slot, :, first:], self.values[slot, :, first:]

    @torch.inference_mode()
    def propose(self, slot: int, first: int, last: int, token_ids: Sequence[int], k: int) -> list[int]:
        """k drafts after a sequence whose entries up to `last` - k - 1 are in its slot (and `first` its first
        position): the window last - k .. last caught up, then the chain."""
        inputs, host, drafts = self._buffers(k)
        window = [max(first, last - k + w) for w in range(k + 1)]
        host.numpy()[:] = [slot, first, last, *(token_ids[p + 1] for p in window)]
        inputs.copy_(host, non_blocking=True)
        span = next(s for s in self.spans if s > last + k)  # the chain's last index is last + k - 1
        graph = self._graphs.get((k, span)) if self.graphs else None
        if self.graphs and graph is None and self._capture(k):
            graph = self._graphs[k, span]
        if graph is not None:
            graph.replay()
        else:
            self._forward((k, span))
        return drafts.tolist()

    def warm_up(self, k: int) -> None:
        """Capture the graphs of k drafts before serving (every span), over slot 0 (free at start-up: what they
        write there is overwritten before it is read)."""
        self.propose(0, 0, k, [0] * (k + 2), k)

    def _buffers(self, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if k not in self._inputs:
            device = self.hidden.device
            host = torch.zeros(4 + k, dtype=torch.long, pin_memory=device.type == "cuda")
            self._inputs[k] = (torch.zeros(4 + k, dtype=torch.long, device=device), host,
                               torch.zeros(k, dtype=torch.long, device=device))
        return self._inputs[k]

    def _capture(self, k: int) -> bool:
        """Capture the graphs of k drafts, one per span (in one memory pool); False where that failed."""
        from runtime.native.cuda.graphs import capture_buckets

        try:
            graphs, _ = capture_buckets([(k, span) for span in self.spans], self._forward)
        except Exception as exc:  # noqa: BLE001 - drafting op by op still works
            logger.warning("EAGLE: the draft chain of %d drafts could not be captured as a CUDA graph (%s): it runs "
                           "op by op", k, exc)
            self.graphs = False
            return False
        self._graphs.update(graphs)
        return True

    def _forward(self, bucket: tuple[int, int]) -> None:
        """The proposal of k drafts from the inputs of `_buffers(k)` into its drafts, attending over the slot's
        first `span` positions (graph-capturable: fixed shapes, no host reads)."""
        k, span = bucket
        inputs, _, drafts = self._inputs[k]
        head, target = self.head, self.target
        slot, first, last = inputs[0], inputs[1], inputs[2]
        window = torch.maximum(last - k + self.positions[: k + 1], first)
        flat = self.hidden.view(-1, self.hidden.shape[-1])
        out = self._step(flat.index_select(0, slot * self.capacity + window), head.embed(inputs[3:], target), window,
                         slot, first, span)[-1:]
        for j in range(k):
            draft = head.logits(out, target).argmax(dim=-1)
            drafts[j : j + 1].copy_(draft)
            if j < k - 1:  # chained step j+1 at index last + j + 1 reads this step's output and its draft
                out = self._step(out, head.embed(draft, target), (last + j + 1).reshape(1), slot, first, span)

    def _step(self, hidden: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor, slot: torch.Tensor,
              first: torch.Tensor, span: int) -> torch.Tensor:
        """The head at T indices `positions` of slot `slot` ([T, H] inputs): their K/V stored, then attention over
        the slot's entries from `first` up to each query's index (all below `span`). Returns the outputs [T, H]."""
        head, capacity = self.head, self.capacity
        x, q, k, v = head.qkv(hidden[None], embeds[None], self.cos[positions], self.sin[positions])
        dim = head.head_dim
        rows = ((slot * head.kv_heads + self.positions[: head.kv_heads])[:, None] * capacity
                + positions[None, :]).reshape(-1)
        self.keys.view(-1, dim).index_copy_(0, rows, k[0].reshape(-1, dim))
        self.values.view(-1, dim).index_copy_(0, rows, v[0].reshape(-1, dim))
        which, keys = slot.reshape(1), self.positions[:span]
        seen = (keys[None, :] >= first) & (keys[None, :] <= positions[:, None])
        return head.layer(x, q, self.keys[:, :, :span].index_select(0, which),
                          self.values[:, :, :span].index_select(0, which), seen[None, None])[0]
