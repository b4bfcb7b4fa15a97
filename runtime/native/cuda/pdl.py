"""Programmatic dependent launch (PDL, Hopper and later): a kernel launched as a programmatic dependent of the one
before it starts while that one drains, and waits for its results only where it calls `wait_for_previous_kernel`.

Why: a batch-1 decode step is ~100 kernels of a few microseconds each, and each launch's start-up (scheduling its
programs, their first loads) would otherwise follow the previous kernel's last program. Every kernel launched with
`launch_options()` must call `wait_for_previous_kernel` before it reads anything an earlier kernel wrote and before
it writes anything; it then also lets the kernel after it start early. CUDA graphs keep the dependency.

The one exception: a step's metadata (positions, slots, sequence lengths, block tables) may be read before the wait.
Only ordinary launches and copies write it (runtime/native/cuda/step_io.py; no kernel launched this way does), and a
programmatic launch starts only once the launch before it has started its own dependents, which an ordinary launch
does when it finishes: by then every write of the metadata has finished.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

ENABLED = (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)
           and hasattr(tl.extra.cuda, "gdc_wait"))


def launch_options(enabled: bool = ENABLED) -> dict[str, Any]:
    """Keyword arguments of a Triton launch: a programmatic dependent launch where enabled."""
    return {"launch_pdl": True} if enabled else {}


@triton.jit
def wait_for_previous_kernel(PDL: tl.constexpr):
    """Let the next kernel launch, then wait until the previous one has finished and its writes are visible."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
