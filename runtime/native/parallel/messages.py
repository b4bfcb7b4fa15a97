"""What rank 0 tells the other tensor-parallel ranks, and how the ranks meet.

Rank 0 (the engine core) broadcasts one message per model call over a gloo group of their own (`control`: host
memory, no device sync; on CUDA the tensors' collectives run on NCCL beside it); every rank then makes the same call,
whose collectives meet inside the model. Messages are pickled (torch.distributed.broadcast_object_list).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from runtime.config import EngineConfig
from runtime.native.lora.weights import LoraWeights
from runtime.native.parallel.group import TensorParallel

# a worker waits for the next step in a broadcast as long as the server idles: no timeout that an idle night reaches
IDLE_TIMEOUT = timedelta(days=365)
HOST = "127.0.0.1"  # the ranks of a group run on one machine


@dataclass
class WorkerArgs:
    """What rank 0 hands a worker process on its stdin."""

    config: EngineConfig
    rank: int
    size: int
    store_port: int  # rank 0's TCPStore, where the ranks meet
    device: str  # this rank's ("cuda:1", or "cpu")
    parent_pid: int


class HostStep(NamedTuple):
    """A step's model inputs on the host (ModelRunner.host_step), from which each rank makes its tensors."""

    token_ids: list[int]
    positions: list[int]
    slots: list[int]
    query_lens: list[int]
    context_lens: list[int]
    tables: np.ndarray  # int32 [inputs, widest table]


# a LoRA slot's change since the last Forward: (slot, adapter key, its whole weights), or (slot, None, None): emptied
SlotChange = tuple[int, int | None, LoraWeights | None]


class Forward(NamedTuple):
    """Run the model over a step; `prev_samples` and `adapter_slots` per input as in StepInputs; first apply
    `lora_changes` to the LoRA slots (DeviceSlots.on_change on rank 0)."""

    step: HostStep
    prev_samples: list[int]
    adapter_slots: list[int]
    lora_changes: list[SlotChange]


class GraphStep(NamedTuple):
    """Replay the decode graph of these packed rows (runtime/native/decode_rows.py's pack_rows), after applying
    `lora_changes` as Forward does."""

    columns: np.ndarray
    tables: np.ndarray
    lora_changes: list[SlotChange]


class Logits(NamedTuple):
    """Logits of rows `rows` of the last Forward's hidden states."""

    rows: list[int]


class Sampled(NamedTuple):
    """Receive the `count` ids rank 0 sampled from the last step's logits (the next step's pending tokens read them:
    async scheduling)."""

    count: int


class CaptureGraphs(NamedTuple):
    """ModelRunner.capture_decode_graphs (every rank captures the same graphs, their collectives inside)."""

    max_rows: int
    max_blocks_per_seq: int


class CopyBlocks(NamedTuple):
    copies: list[tuple[int, int]]


class Profile(NamedTuple):
    """ModelRunner.profile_activation_bytes's forward pass."""

    max_num_tokens: int
    max_batch_size: int
    context_window: int


class AllocateCache(NamedTuple):
    num_blocks: int
    dtype: torch.dtype | None = None  # None: the model's (else --kv-cache-dtype fp8's)


class Stop(NamedTuple):
    pass


def joining_key(rank: int) -> str:
    """The store key a worker sets just before it joins the group (rank 0 waits for it: Workers)."""
    return f"joining/{rank}"


def join_group(rank: int, size: int, store: dist.Store, device: torch.device) -> tuple[TensorParallel, Any]:
    """Join the ranks' process group (NCCL on CUDA, gloo on CPU): (the group, the control group of the messages)."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=IDLE_TIMEOUT,
                            device_id=device if device.type == "cuda" else None)
    control = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    return TensorParallel(rank, size, dist.group.WORLD), control


def broadcast(message: object, control: Any) -> object:
    """Rank 0's `message`, on every rank (rank 0 passes it, the others None)."""
    box = [message]
    dist.broadcast_object_list(box, src=0, group=control)
    return box[0]
