"""ModelRunner: turns one step's sequences into flat tensors, runs the model, samples.

The only place where scheduled work becomes tensors: input ids, positions and AttentionMetadata
(query_start_loc, context/seq lens, block tables, slot mapping) for the packed step; then the forward
pass over the paged KV cache, logits for the rows that need them, and the sampler.

Extension points kept open on purpose: a step input carries per-sequence token lists of any length
(speculative verification scores K+1 tokens at once), and `StepInput` is the place for per-token
adapter indices (LoRA).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from runtime.attention_metadata import AttentionMetadata
from runtime.lora.apply import LoraBatch
from runtime.models import CausalLM, allocate_kv_cache
from runtime.sampler import Sampler, SamplingRow

if TYPE_CHECKING:
    from runtime.cuda.graphs import DecodeGraphs


@dataclass
class StepInput:
    """One sequence's share of a step."""

    token_ids: list[int]  # the new tokens computed this step
    start_pos: int  # position of token_ids[0] = tokens already in the cache
    block_table: list[int]  # covers positions 0 .. start_pos + len(token_ids) - 1
    # Rows sampled from the last new token's logits: none mid-prompt, one normally, n when forking.
    sample_rows: list[SamplingRow] = field(default_factory=list)
    return_all_logits: bool = False  # logits of every new token (prompt logprobs, context logits)
    return_sample_logits: bool = False  # the raw logits the sampled rows came from (generation logits)
    adapter_slot: int = -1  # LoRA device slot of the sequence's adapter; -1: the base model
    # keep all_logits / sample_logits on the device (speculative verification and drafting read them
    # there and copy back only the chosen ids)
    logits_on_device: bool = False


@dataclass
class StepResult:
    """What the step produced for one StepInput (tensors are float32, on the CPU unless asked otherwise)."""

    token_ids: list[int] = field(default_factory=list)  # one per sample row
    logprobs: list[float] = field(default_factory=list)  # raw logprob of each chosen token
    top: list[list[tuple[int, float]]] = field(default_factory=list)  # per row, best first
    all_logits: torch.Tensor | None = None  # [len(token_ids of the input), vocab]
    sample_logits: torch.Tensor | None = None  # [1, vocab]: the row every sample was drawn from
    # (on the runner's device instead when the input asked for logits_on_device)


def _deliver(logits: torch.Tensor, inp: StepInput) -> torch.Tensor:
    return logits if inp.logits_on_device else logits.cpu()


class ModelRunner:
    """Owns the model and its KV cache; executes steps."""

    def __init__(self, model: CausalLM, block_size: int, sampler: Sampler) -> None:
        self.model = model
        self.block_size = block_size
        self.sampler = sampler
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.kv_caches: list[torch.Tensor] = []
        self.lora: LoraBatch | None = None  # set by the engine when LoRA is available
        self.graphs: DecodeGraphs | None = None  # CUDA graphs of decode steps (capture_decode_graphs)
        if self.device.type == "cuda":
            from runtime.cuda import enable_cuda_kernels

            enable_cuda_kernels(model)

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """Allocate the paged cache (in the model's dtype); call once, after profiling."""
        self.kv_caches = allocate_kv_cache(self.model.spec, num_blocks, self.block_size, self.dtype, self.device)

    def capture_decode_graphs(self, max_rows: int, max_blocks_per_seq: int,
                              lora_version: Callable[[], int] = lambda: 0) -> None:
        """Capture decode-shaped steps of up to `max_rows` new tokens (CUDA only; after allocate_kv_cache).

        `lora_version` changes whenever a Linear gets adapter weights (the LoRA graphs are then recaptured).
        """
        from runtime.cuda.graphs import DecodeGraphs

        self.graphs = DecodeGraphs(self.model, self.kv_caches, self.block_size, max_rows, max_blocks_per_seq,
                                   self.lora, lora_version)

    @property
    def kv_cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.kv_caches)

    @torch.inference_mode()
    def execute(self, inputs: Sequence[StepInput], copies: Sequence[tuple[int, int]] = ()) -> list[StepResult]:
        """Copy-on-write copies, one forward pass over every input's new tokens, then sampling."""
        self.copy_blocks(copies)
        hidden = graph_logits = None
        if self.graphs is not None and self.graphs.accepts(inputs):
            graph_logits = self.graphs.run(inputs)  # one row per new token, in order
        else:
            if self.lora is not None:  # per-token adapter slots for the hooked Linears (runtime/lora/apply.py)
                self.lora.set([len(inp.token_ids) for inp in inputs], [inp.adapter_slot for inp in inputs])
            input_ids, positions, meta = self.prepare(inputs)
            hidden = self.model(input_ids, positions, self.kv_caches, meta)

        # Rows needing logits: every new token of inputs that return all logits, else the last one.
        rows: list[int] = []
        spans: list[tuple[int, int]] = []  # per input: its rows in `logits`
        end = 0
        for inp in inputs:
            end += len(inp.token_ids)
            first = len(rows)
            if inp.return_all_logits:
                rows.extend(range(end - len(inp.token_ids), end))
            elif inp.sample_rows:
                rows.append(end - 1)
            spans.append((first, len(rows)))
        results = [StepResult() for _ in inputs]
        if not rows:
            return results
        if graph_logits is None:
            logits = self.model.compute_logits(hidden[torch.tensor(rows, device=self.device)])
        elif len(rows) == graph_logits.shape[0]:  # every token needs its logits (plain decode steps)
            logits = graph_logits.clone() if any(inp.logits_on_device for inp in inputs) else graph_logits
        else:  # a gather is a copy: the graph's output buffer is overwritten by the next replay
            logits = graph_logits[torch.tensor(rows, device=self.device)]

        sample_idx: list[int] = []
        sample_rows: list[SamplingRow] = []
        for b, inp in enumerate(inputs):
            first, last = spans[b]
            if inp.return_all_logits:
                results[b].all_logits = _deliver(logits[first:last], inp)
            if inp.sample_rows:
                sample_idx.extend([last - 1] * len(inp.sample_rows))
                sample_rows.extend(inp.sample_rows)
                if inp.return_sample_logits:
                    results[b].sample_logits = _deliver(logits[last - 1 : last], inp)
        if sample_rows:
            # usually one sampled row per input, in order: then skip the gather (a copy of [rows, vocab] floats)
            identity = sample_idx == list(range(logits.shape[0]))
            picked = logits if identity else logits[torch.tensor(sample_idx, device=self.device)]
            self._sample(picked, sample_rows, inputs, results)
        return results

    def _sample(
        self,
        logits: torch.Tensor,
        rows: list[SamplingRow],
        inputs: Sequence[StepInput],
        results: list[StepResult],
    ) -> None:
        out = self.sampler(logits, rows)
        # one wait for all device-to-host copies instead of one synchronising .tolist() per tensor
        fetched = [t.to("cpu", non_blocking=True) if t is not None else None
                   for t in (out.token_ids, out.logprobs, out.top_ids, out.top_logprobs)]
        if logits.is_cuda:
            torch.cuda.current_stream(logits.device).synchronize()
        token_ids, logprobs, top_ids, top_lps = (t.tolist() if t is not None else None for t in fetched)
        assert token_ids is not None and logprobs is not None
        i = 0
        for inp, res in zip(inputs, results):
            for _ in inp.sample_rows:
                res.token_ids.append(token_ids[i])
                res.logprobs.append(logprobs[i])
                res.top.append(list(zip(top_ids[i], top_lps[i])) if top_ids is not None else [])
                i += 1

    def prepare(self, inputs: Sequence[StepInput]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Flat input ids and positions of all new tokens, and their AttentionMetadata."""
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start = [0]
        context_lens: list[int] = []
        seq_lens: list[int] = []
        for inp in inputs:
            end = inp.start_pos + len(inp.token_ids)
            input_ids.extend(inp.token_ids)
            positions.extend(range(inp.start_pos, end))
            slots.extend(inp.block_table[p // bs] * bs + p % bs for p in range(inp.start_pos, end))
            query_start.append(query_start[-1] + len(inp.token_ids))
            context_lens.append(inp.start_pos)
            seq_lens.append(end)
        width = max(len(inp.block_table) for inp in inputs)
        tables = [inp.block_table + [0] * (width - len(inp.block_table)) for inp in inputs]
        query_lens = [len(inp.token_ids) for inp in inputs]

        def tensor(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=self.device)

        meta = AttentionMetadata(
            query_start_loc=tensor(query_start, torch.int32),
            context_lens=tensor(context_lens, torch.int32),
            seq_lens=tensor(seq_lens, torch.int32),
            block_tables=tensor(tables, torch.int32),
            slot_mapping=tensor(slots, torch.int64),
            block_size=bs,
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
            query_lens_host=query_lens,
            seq_lens_host=seq_lens,
        )
        return tensor(input_ids, torch.long), tensor(positions, torch.long), meta

    @torch.inference_mode()
    def profile_activation_bytes(self, max_num_tokens: int, max_batch_size: int, context_window: int) -> int:
        """Peak CUDA memory of the largest step (max_num_tokens prompt tokens, no cache); 0 off CUDA."""
        if self.device.type != "cuda":
            return 0
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        lengths = [context_window] * (max_num_tokens // context_window)
        if max_num_tokens % context_window:
            lengths.append(max_num_tokens % context_window)
        inputs = [StepInput([0] * n, 0, [0] * -(-n // self.block_size)) for n in lengths]
        input_ids, positions, meta = self.prepare(inputs)
        hidden = self.model(input_ids, positions, [], meta)
        logits = self.model.compute_logits(hidden[:1].expand(max_batch_size, -1))
        torch.softmax(logits, dim=-1)  # the sampler's [batch, vocab] temporaries
        peak = torch.cuda.max_memory_allocated(self.device) - base
        del hidden, logits
        torch.cuda.empty_cache()
        return int(peak)

    def copy_blocks(self, copies: Sequence[tuple[int, int]]) -> None:
        """Copy whole KV blocks src -> dst in every layer (copy-on-write of shared blocks)."""
        if not copies:
            return
        src = torch.tensor([s for s, _ in copies], device=self.device)
        dst = torch.tensor([d for _, d in copies], device=self.device)
        for cache in self.kv_caches:
            cache[:, dst] = cache[:, src]
