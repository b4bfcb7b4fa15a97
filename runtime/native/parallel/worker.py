"""A tensor-parallel worker process (ranks 1..N-1): loads its share of the weights, then makes each model call that
rank 0 broadcasts (runtime/native/parallel/messages.py) until Stop. No scheduler, sampler or requests here: rank 0
runs those once and gathers the logits. Rank 0 launches it (`run`, runtime/process/launcher.py: a process named
`tp-worker-N`); it dies with rank 0's process (runtime/process/parent.py).
"""

from __future__ import annotations

import dataclasses
import logging
import sys

import msgspec
import torch
import torch.distributed as dist

from runtime.native.core_loader import describe_model
from runtime.native.decode_rows import fill_pending
from runtime.native.lora import LoraManager
from runtime.native.model_runner import ModelRunner
from runtime.native.models import load_model
from runtime.native.models.cpu_weights import prepare_cpu_weights
from runtime.native.parallel import group as tp_group
from runtime.native.parallel.messages import (
    HOST,
    IDLE_TIMEOUT,
    AllocateCache,
    CaptureGraphs,
    CopyBlocks,
    Forward,
    GraphStep,
    Logits,
    Profile,
    Sampled,
    SlotChange,
    Stop,
    WorkerArgs,
    broadcast,
    join_group,
    joining_key,
)
from runtime.native.sampler import Sampler
from runtime.native.step_inputs import StepInputs
from runtime.process.parent import exit_when_orphaned

logger = logging.getLogger(__name__)


class Worker:
    """One rank's model and KV cache, driven by rank 0's messages."""

    def __init__(self, args: WorkerArgs) -> None:
        config = dataclasses.replace(args.config, device=args.device)
        model = describe_model(config)
        device = model.device
        if device.type == "cpu":
            torch.set_num_threads(max(1, torch.get_num_threads() // args.size))
        store = dist.TCPStore(HOST, args.store_port, args.size, is_master=False, timeout=IDLE_TIMEOUT)
        store.set(joining_key(args.rank), "1")
        tp, self.control = join_group(args.rank, args.size, store, device)
        tp_group.use(tp)
        self.tp = tp
        weights = load_model(model.path, model.dtype, device, model.info.context_window, config.quantization)
        if device.type == "cpu":
            prepare_cpu_weights(weights, "none")  # as rank 0 does without --cpu-quantization (refused with TP)
        self.runner = ModelRunner(weights, config.kv_block_size, Sampler(config.seed))
        self.lora = LoraManager(config, weights)  # its slots only: rank 0 says what they hold (Forward.lora_changes)
        self.runner.lora = self.lora.batch
        self.hidden: torch.Tensor | None = None  # the last Forward's hidden states

    @torch.inference_mode()
    def serve(self) -> None:
        runner = self.runner
        while True:
            msg = broadcast(None, self.control)
            if isinstance(msg, Forward):
                inputs = StepInputs()  # what fill_pending reads: each input's token count and pending sample
                inputs.counts, inputs.prev_samples = msg.step.query_lens, msg.prev_samples
                self.apply(msg.lora_changes)
                self.lora.batch.set(msg.step.query_lens, msg.adapter_slots)
                input_ids, positions, meta = runner.tensors(msg.step)
                fill_pending(inputs, input_ids, runner.last_sampled)
                self.hidden = runner.model(input_ids, positions, runner.kv_caches, meta)
                runner.last_sampled = None  # (as rank 0's launch: until the step's samples come, Sampled)
            elif isinstance(msg, GraphStep):
                self.apply(msg.lora_changes)
                graphs = runner.graphs  # DecodeGraphs (CaptureGraphs; CUDA only)
                assert graphs is not None
                # the graph's greedy ids, which rank 0 reads as the step's samples too unless it samples otherwise
                out = graphs.replay(msg.columns, msg.tables, runner.last_sampled)  # type: ignore[union-attr]
                runner.last_sampled = out.greedy
            elif isinstance(msg, Logits):
                assert self.hidden is not None
                rows = torch.tensor(msg.rows, dtype=torch.long, device=runner.device)
                runner.model.compute_logits(self.hidden[rows])
            elif isinstance(msg, Sampled):
                runner.last_sampled = torch.empty(msg.count, dtype=torch.long, device=runner.device)
                dist.broadcast(runner.last_sampled, src=0, group=self.tp.group)
            elif isinstance(msg, CaptureGraphs):
                runner.capture_decode_graphs(*msg, lora_version=lambda: self.lora.slots.version)
            elif isinstance(msg, CopyBlocks):
                runner.copy_blocks(msg.copies)
            elif isinstance(msg, Profile):
                runner.profile_activation_bytes(*msg)
            elif isinstance(msg, AllocateCache):
                runner.allocate_kv_cache(msg.num_blocks, msg.dtype)
            elif isinstance(msg, Stop):
                return
            else:
                raise TypeError(f"unknown message {type(msg).__name__}")

    def apply(self, changes: list[SlotChange]) -> None:
        """Place or empty LoRA slots as rank 0 did."""
        for slot, key, lora_weights in changes:
            if key is None or lora_weights is None:
                self.lora.slots.clear(slot)
            else:
                self.lora.slots.place(slot, key, lora_weights)


def run(encoded_args: bytes) -> int:
    """Entry point of a worker process, launched by rank 0 (runtime/process/launcher.py) with its WorkerArgs."""
    args = msgspec.msgpack.decode(encoded_args, type=WorkerArgs)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s tp-worker-{args.rank} %(name)s: %(message)s")
    exit_when_orphaned(args.parent_pid)
    worker = Worker(args)
    worker.serve()
    worker.runner.release_graphs()
    dist.destroy_process_group()
    return 0
