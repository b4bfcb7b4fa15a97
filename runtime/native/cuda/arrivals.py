"""Arrival counters for kernels whose programs split one output tile's work (split-K): each program stores its part,
counts itself in, and the last of the tile's programs to arrive sums the parts in a fixed order, so the result does
not depend on which program finished first (runtime/native/cuda/one_token_moe.py's down kernel, the INT4 GEMV's
split-K in runtime/native/cuda/int4_gemv.py).

The counters are per device and shared by every such kernel: each launch leaves them at zero, and kernels run in
stream order (a programmatic dependent launch counts only after `wait_for_previous_kernel`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_held: dict[torch.device, torch.Tensor] = {}


def counters(device: torch.device, n: int) -> torch.Tensor:
    """n int32 counters at zero; the kernel that uses them leaves them at zero."""
    held = _held.get(device)
    if held is None or held.numel() < n:
        held = _held[device] = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
    return held


@triton.jit
def arrived_last(arrivals_ptr, index, count):
    """Count this program in at counter `index` (after every thread's stores: a barrier, then a release) and say
    whether it is the last of the `count` programs to arrive; that one sets the counter back to zero for the next
    launch and sees the others' stores (acquire; read them from the L2 with cache_modifier=".cg")."""
    tl.debug_barrier()
    last = tl.atomic_add(arrivals_ptr + index, 1, sem="acq_rel") == count - 1
    tl.store(arrivals_ptr + index, 0, mask=last)
    return last
