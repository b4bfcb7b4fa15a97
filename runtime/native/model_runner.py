"""ModelRunner: turns one step's sequences into flat tensors, runs the model, samples.

The only place where scheduled work becomes tensors: input ids, positions and AttentionMetadata
(query_start_loc, context/seq lens, block tables, slot mapping) for the packed step; then the forward
pass over the paged KV cache, logits for the rows that need them, and the sampler.

Extension points kept open on purpose: a step input carries per-sequence token lists of any length
(speculative verification scores K+1 tokens at once), and `StepInput` is the place for per-token
adapter indices (LoRA).

`launch` queues a step on the device and returns at once; `PendingStep.collect` waits for its sampled
ids. Between the two the host may prepare (and launch) the next step: a decode input may then name its
token as "row r of the previous launch's samples" (`StepInput.prev_sample`), which is read on the device,
so the next step never waits for the host to learn the token (the engine's async scheduling).

Under tensor parallelism this is rank 0's runner: `peers` tells the other ranks each model call before it makes its
own (runtime/native/parallel/), with the step's host inputs (`host_step`) from which every rank makes its tensors.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import TYPE_CHECKING, NamedTuple

import torch

from runtime.native.attention_metadata import AttentionMetadata
from runtime.native.block_tables import BlockTables, step_tables
from runtime.native.decode_rows import MAX_ROWS_PER_SEQ, DecodeOutput, fill_pending, pack_rows
from runtime.native.device import host_tensor, record_now, to_device
from runtime.native.lora.apply import LoraBatch
from runtime.native.models import CausalLM, allocate_kv_cache
from runtime.native.parallel.messages import HostStep
from runtime.native.sampler import Sampler, SamplingRow, plain_greedy
from runtime.native.step_inputs import StepInput, StepInputs
from runtime.native.step_results import StepResults

if TYPE_CHECKING:
    from runtime.native.cpu.compiled_decode import CompiledDecode
    from runtime.native.cuda.graphs import DecodeGraphs
    from runtime.native.cuda.mixed_graphs import MixedGraphs
    from runtime.native.cuda.prefill_graphs import PrefillGraphs
    from runtime.native.parallel.workers import Workers


class RowArgmax(NamedTuple):
    """Greedy ids of a step's rows on their way to the host, and (input, its first id, one past its last) of each input
    asking."""

    ids: torch.Tensor
    spans: list[tuple[int, int, int]]


class PendingStep:
    """A launched step: its sampled ids are being copied to the host; `collect` waits for them."""

    def __init__(self, counts: list[int], fetched: list[torch.Tensor | None], done: torch.cuda.Event | None,
                 row_argmax: RowArgmax | None = None, all_logits: dict[int, torch.Tensor] | None = None,
                 sample_logits: dict[int, torch.Tensor] | None = None) -> None:
        self._counts, self._fetched, self._done, self._row_argmax = counts, fetched, done, row_argmax
        self._all_logits, self._sample_logits = all_logits, sample_logits

    def collect(self) -> StepResults:
        if self._done is not None:
            self._done.synchronize()
        row_argmax = None
        if self._row_argmax is not None:
            ids = self._row_argmax.ids.tolist()
            row_argmax = {b: ids[start:end] for b, start, end in self._row_argmax.spans}
        token_ids, logprobs, top_ids, top_lps = (t.tolist() if t is not None else None for t in self._fetched)
        return StepResults(self._counts, token_ids, logprobs, top_ids, top_lps, self._all_logits, self._sample_logits,
                           row_argmax)


class Forward(NamedTuple):
    """A step's forward pass: hidden states (op by op) or float32 logits (graphs), and where each input's new
    tokens start in them; `decode`: the decode graph's output when one graph ran the whole step; `kept`: every new
    token's final hidden state and where each input's start, from graphs that keep them (prefill graphs under EAGLE)."""

    values: torch.Tensor
    first_rows: list[int]
    are_logits: bool
    decode: DecodeOutput | None = None
    kept: tuple[torch.Tensor, list[int]] | None = None

    @property
    def hidden(self) -> tuple[torch.Tensor, list[int]] | None:
        """The final hidden states of every new token and where each input's start, where the step has them."""
        if not self.are_logits:
            return self.values, self.first_rows
        if self.decode is not None and self.decode.hidden is not None:
            return self.decode.hidden, self.first_rows
        return self.kept


def _kept_rows(inputs: StepInputs, most: int, decoded: DecodeOutput | None,
               prefill: PrefillGraphs) -> tuple[torch.Tensor, list[int]]:
    """The final hidden states of a step run as a decode graph (the inputs of at most `most` tokens) and a prefill
    graph (the others): the decode rows', then the prompts', each part's in its inputs' order, and where each
    input's rows start."""
    assert prefill.hidden is not None
    rows = sum(n for n in inputs.counts if n <= most)
    prompts = prefill.hidden[: sum(inputs.counts) - rows]
    starts = _split_rows(inputs, most, rows, every_prompt_row=True)
    if decoded is None:
        return prompts, starts
    assert decoded.hidden is not None
    return torch.cat([decoded.hidden[:rows], prompts]), starts


def _split_rows(inputs: StepInputs, most: int, prompt_row: int, every_prompt_row: bool = False) -> list[int]:
    """Row of each input's first new token in the logits of a step split in two: every token of the inputs of at
    most `most` tokens, in order from row 0, then one row per other input (a prompt's last token) from
    `prompt_row`; a prompt's "first row" is placed so that its last token lands on its one row. With
    `every_prompt_row` a prompt has a row per token (hidden states), from its first."""
    rows, row, prompt = [], 0, prompt_row
    for n in inputs.counts:
        if n <= most:
            rows.append(row)
            row += n
        elif every_prompt_row:
            rows.append(prompt)
            prompt += n
        else:
            rows.append(prompt - (n - 1))
            prompt += 1
    return rows


def _span(ends: list[int], b: int) -> tuple[int, int]:
    """Input `b`'s rows in a step's logits, from each input's end there (ModelRunner.launch)."""
    return ends[b - 1] if b else 0, ends[b]


def _step_done(logits: torch.Tensor) -> torch.cuda.Event | None:
    """An event recorded after the step's work on a CUDA device (None elsewhere: the step has run already)."""
    if not logits.is_cuda:
        return None
    done = torch.cuda.Event()
    record_now(done, logits)
    return done


def _deliver(logits: torch.Tensor, on_device: bool) -> torch.Tensor:
    return logits if on_device else logits.cpu()


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
        # the BlockManager's resident block tables, which StepInput.table_row index (set by the engine)
        self.block_tables: BlockTables | None = None
        # decode steps captured as CUDA graphs (capture_decode_graphs) or compiled on CPU (compile_decode)
        self.graphs: DecodeGraphs | CompiledDecode | None = None
        self.prefill_graphs: PrefillGraphs | None = None  # prefill steps (capture_prefill_graphs)
        self.mixed_graphs: MixedGraphs | None = None  # decode rows and prompts together (capture_prefill_graphs)
        self.last_sampled: torch.Tensor | None = None  # the last launch's sampled ids, on the device
        self.eager_steps = 0  # steps run op by op, not replayed from graphs (or a compiled step on CPU)
        self.peers: Workers | None = None  # the other tensor-parallel ranks (rank 0 only; set by the loader)
        # EAGLE drafting reads the target's final hidden states: steps then run op by op, or through decode steps that
        # hand them out (`hands_out_hidden`: the CPU's C++ and compiled steps, CUDA decode graphs captured after it is
        # set), and `hidden` holds the last launch's (all rows, where each input's rows start)
        self.keep_hidden = False
        self.hidden: tuple[torch.Tensor, list[int]] | None = None
        if self.device.type == "cuda":
            from runtime.native.cuda import enable_cuda_kernels

            enable_cuda_kernels(model)

    def allocate_kv_cache(self, num_blocks: int, dtype: torch.dtype | None = None) -> None:
        """Allocate the paged cache (in `dtype`, default the model's); call once, after profiling."""
        if self.peers is not None:
            self.peers.allocate_cache(num_blocks, dtype)
        self.kv_caches = allocate_kv_cache(self.model.spec, num_blocks, self.block_size, dtype or self.dtype,
                                           self.device)

    def capture_decode_graphs(self, max_rows: int, max_blocks_per_seq: int,
                              lora_version: Callable[[], int] = lambda: 0) -> None:
        """Capture decode-shaped steps of up to `max_rows` new tokens (CUDA only; after allocate_kv_cache).

        `lora_version` changes whenever a Linear gets adapter weights (the LoRA graphs are then recaptured).
        """
        from runtime.native.cuda.graphs import DecodeGraphs

        if self.peers is not None:
            self.peers.capture_graphs(max_rows, max_blocks_per_seq)
        self.graphs = DecodeGraphs(self.model, self.kv_caches, self.block_size, max_rows, max_blocks_per_seq,
                                   self.lora, lora_version, keep_hidden=self.keep_hidden)

    def capture_prefill_graphs(self, max_tokens: int, max_blocks_per_seq: int,
                               lora_version: Callable[[], int] = lambda: 0) -> None:
        """Capture steps that prefill a few sequences with up to `max_tokens` tokens, and with decode graphs
        captured, steps where prompts join decode rows (CUDA only; after allocate_kv_cache; `lora_version` as for
        capture_decode_graphs)."""
        from runtime.native.cuda.graphs import DecodeGraphs
        from runtime.native.cuda.mixed_graphs import MixedGraphs
        from runtime.native.cuda.prefill_graphs import PrefillGraphs

        self.prefill_graphs = PrefillGraphs(self.model, self.kv_caches, self.block_size, max_tokens,
                                            max_blocks_per_seq, self.lora, lora_version, keep_hidden=self.keep_hidden)
        if isinstance(self.graphs, DecodeGraphs) and not self.keep_hidden:  # (mixed graphs hand out logits only)
            self.mixed_graphs = MixedGraphs(self.graphs, self.prefill_graphs, lora_version)

    def release_graphs(self) -> None:
        """On CUDA, drop the captured steps and wait for the device (before a tensor-parallel group is destroyed: NCCL
        waits in destroy_process_group for the collectives that live CUDA graphs hold)."""
        if self.device.type != "cuda":
            return
        self.graphs = self.prefill_graphs = self.mixed_graphs = None
        gc.collect()  # (a graph still in a reference cycle would keep its collectives)
        torch.cuda.synchronize(self.device)

    def compile_decode(self, max_blocks_per_seq: int, scratch_block: int) -> CompiledDecode:
        """Single-stream decode steps on CPU, compiled and warmed up in KV block `scratch_block` (after
        allocate_kv_cache; slow: about a minute). Setting them as `graphs` makes steps use them."""
        from runtime.native.cpu.compiled_decode import CompiledDecode

        graphs = CompiledDecode(self.model, self.kv_caches, self.block_size, max_blocks_per_seq, self.lora)
        graphs.warm_up(scratch_block)
        return graphs

    @property
    def kv_cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.kv_caches)

    def execute(self, inputs: StepInputs | Sequence[StepInput], copies: Sequence[tuple[int, int]] = ()) -> StepResults:
        """Copy-on-write copies, one forward pass over every input's new tokens, then sampling."""
        return self.launch(inputs, copies).collect()

    @torch.inference_mode()
    def launch(self, inputs: StepInputs | Sequence[StepInput], copies: Sequence[tuple[int, int]] = ()) -> PendingStep:
        """`execute` without waiting: the step is queued on the device (see the module docstring)."""
        try:
            return self._launch(inputs, copies)
        except Exception as exc:
            if self.peers is not None:
                self.peers.explain(exc)  # a collective that failed because a worker died says so
            raise

    def _launch(self, inputs: StepInputs | Sequence[StepInput], copies: Sequence[tuple[int, int]]) -> PendingStep:
        inputs = StepInputs.of(inputs)
        self.copy_blocks(copies)
        forward = self._forward(inputs, self.last_sampled)
        self.last_sampled = None
        self.hidden = forward.hidden if self.keep_hidden else None
        # Rows needing logits: every new token of inputs that return all logits, else the last one; each sample row
        # is drawn from its input's last row in `logits`.
        rows: list[int] = []
        ends: list[int] = []  # per input: one past its last row in `logits` (it starts where the previous one ends)
        counts: list[int] = []  # per input: its sample rows
        sample_idx: list[int] = []
        sample_rows: list[SamplingRow] = []
        all_logits_of = inputs.all_logits
        for b, (first, n, drawn) in enumerate(zip(forward.first_rows, inputs.counts, inputs.sample_rows)):
            if b in all_logits_of:
                rows.extend(range(first, first + n))
            elif drawn:
                rows.append(first + n - 1)
            ends.append(len(rows))
            k = len(drawn)
            counts.append(k)
            if k == 1:  # the common case, without a list made for it
                sample_idx.append(len(rows) - 1)
                sample_rows.append(drawn[0])
            elif k:
                sample_idx.extend([len(rows) - 1] * k)
                sample_rows.extend(drawn)
        if not rows:
            return PendingStep(counts, [None] * 4, None)
        values = forward.values
        if not forward.are_logits:
            if self.peers is not None:
                self.peers.logits(rows)
            logits = self.model.compute_logits(values[host_tensor(rows, torch.long, self.device)])
        elif len(rows) == values.shape[0]:  # every row (plain decode steps); rows ascend, so in order
            logits = values.clone() if inputs.on_device else values
        else:  # a gather is a copy: a graph's output buffer is overwritten by the next replay
            logits = values[host_tensor(rows, torch.long, self.device)]
        row_argmax = self._row_argmax(inputs, forward, ends, logits)

        on_device = inputs.on_device
        all_logits = {b: _deliver(logits[slice(*_span(ends, b))], b in on_device) for b in sorted(all_logits_of)}
        sample_logits = {b: _deliver(logits[ends[b] - 1 : ends[b]], b in on_device)
                         for b in sorted(inputs.sample_logits) if inputs.sample_rows[b]}
        if not sample_rows:
            return PendingStep(counts, [None] * 4, _step_done(logits) if row_argmax else None, row_argmax, all_logits)
        # usually one sampled row per input, in order: then skip the gather (a copy of [rows, vocab] floats)
        identity = sample_idx == list(range(logits.shape[0]))
        decode = forward.decode
        if (decode is not None and decode.greedy is not None and identity
                and len(rows) == decode.greedy.shape[0] and plain_greedy(sample_rows)):
            # the graph took every row's argmax and wrote it to pinned host memory: nothing left to launch
            self.last_sampled = decode.greedy
            fetched: list[torch.Tensor | None] = [decode.greedy_host, None, None, None]
        else:
            picked = logits if identity else logits[host_tensor(sample_idx, torch.long, self.device)]
            out = self.sampler(picked, sample_rows)
            self.last_sampled = out.token_ids
            if self.peers is not None:
                self.peers.share_sampled(out.token_ids)
            # one wait, in collect(), for all device-to-host copies instead of one synchronising .tolist() each
            fetched = [t.to("cpu", non_blocking=True) if t is not None else None
                       for t in (out.token_ids, out.logprobs, out.top_ids, out.top_logprobs)]
        return PendingStep(counts, fetched, _step_done(logits), row_argmax, all_logits, sample_logits)

    @staticmethod
    def _row_argmax(inputs: StepInputs, forward: Forward, ends: list[int],
                    logits: torch.Tensor) -> RowArgmax | None:
        """The greedy ids of the inputs that ask for them (return_row_argmax), on their way to the host: a decode
        graph took every row's already (in pinned memory), else one argmax over the step's logits rows."""
        asking = sorted(inputs.row_argmax)
        if not asking:
            return None
        decode = forward.decode
        if decode is not None and decode.greedy_host is not None:
            first = forward.first_rows
            return RowArgmax(decode.greedy_host, [(b, first[b], first[b] + inputs.counts[b]) for b in asking])
        ids = logits.argmax(dim=-1).to("cpu", non_blocking=True)
        return RowArgmax(ids, [(b, *_span(ends, b)) for b in asking])

    def _forward(self, inputs: StepInputs, last_sampled: torch.Tensor | None) -> Forward:
        """Run the step's forward pass: replayed from graphs where they cover it, else op by op.

        A step where prompts join decode rows replays a mixed graph (runtime/native/cuda/mixed_graphs.py), or where
        that does not fit, a decode graph for the rows and a prefill graph for the prompts: one or two launches
        instead of a few hundred (streams whose requests end at different steps bring a prompt to almost every
        step; run op by op those steps held the engine core to a third of its decode rate, RESULTS.md).
        """
        graphs, prefill = self.graphs, self.prefill_graphs
        if self.keep_hidden:  # graphs that hand out no hidden states are not for these steps
            graphs = graphs if graphs is not None and graphs.hands_out_hidden else None
            prefill = prefill if prefill is not None and prefill.keep_hidden else None
        if graphs is not None and graphs.accepts(inputs):
            if self.peers is None:
                out = graphs.run(inputs, last_sampled, self.block_tables)  # one row per new token, in order
            else:  # (CUDA only: DecodeGraphs) the other ranks replay the same rows' graph
                columns, tables = pack_rows(inputs, self.block_size, self.block_tables)
                self.peers.graph_step(columns, tables)
                out = graphs.replay(columns, tables, last_sampled)  # type: ignore[union-attr]
            return Forward(out.logits, inputs.first_rows(), True, out)
        if prefill is not None:
            # prompts are the inputs past a decode graph's tokens per sequence; failing that (the rows do not fit
            # the decode graphs: a prompt's few tokens past a prefix-cache hit), every input of several tokens
            for most in (MAX_ROWS_PER_SEQ, 1):
                rest = inputs.select([b for b, n in enumerate(inputs.counts) if n <= most])
                prompts = inputs.select([b for b, n in enumerate(inputs.counts) if n > most])
                if (self.mixed_graphs is not None and not self.keep_hidden
                        and self.mixed_graphs.accepts(rest, prompts)):
                    logits, prompt_row = self.mixed_graphs.run(rest, prompts, last_sampled, self.block_tables)
                    return Forward(logits, _split_rows(inputs, most, prompt_row), True)
                if prefill.accepts(prompts) and (not rest or (graphs is not None and graphs.accepts(rest))):
                    decoded = graphs.run(rest, last_sampled, self.block_tables) if rest else None  # type: ignore[union-attr]
                    parts = [decoded.logits] if decoded is not None else []
                    parts.append(prefill.run(prompts))
                    first_rows = _split_rows(inputs, most, len(rest.token_ids))
                    kept = _kept_rows(inputs, most, decoded, prefill) if self.keep_hidden else None
                    return Forward(torch.cat(parts) if rest else parts[0], first_rows, True, kept=kept)
        self.eager_steps += 1
        if self.lora is not None:  # per-token adapter slots for the hooked Linears (runtime/native/lora/apply.py)
            self.lora.set(inputs.counts, inputs.adapter_slots)
        step = self.host_step(inputs)
        if self.peers is not None:
            self.peers.forward(step, inputs.prev_samples, inputs.adapter_slots)
        input_ids, positions, meta = self.tensors(step)
        fill_pending(inputs, input_ids, last_sampled)
        return Forward(self.model(input_ids, positions, self.kv_caches, meta), inputs.first_rows(), False)

    def prepare(self, inputs: StepInputs | Sequence[StepInput]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Flat input ids and positions of all new tokens, and their AttentionMetadata."""
        return self.tensors(self.host_step(inputs))

    def host_step(self, inputs: StepInputs | Sequence[StepInput]) -> HostStep:
        """The step's flat input ids, positions and cache slots, and its block tables, on the host."""
        inputs = StepInputs.of(inputs)
        bs = self.block_size
        positions: list[int] = []
        slots: list[int] = []
        for start, n, table in zip(inputs.start_pos, inputs.counts, inputs.block_tables):
            positions.extend(range(start, start + n))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
        return HostStep(inputs.token_ids, positions, slots, inputs.counts, inputs.start_pos,
                        step_tables(inputs, self.block_tables))

    def tensors(self, step: HostStep) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """`step`'s input ids and positions, and its AttentionMetadata, on the device.

        A step whose one-token rows (decodes, first in a step) come before prompts gets a mixed metadata
        (AttentionMetadata.decode), as a mixed graph does: on CUDA the decode kernel then reads each row's keys once
        for its query group, where the prefill kernel read them once per query head in a 64-row tile (steps of 4,096
        prompt tokens beside 250 decode rows spent 13 ms of an 8B step in attention, RESULTS.md 2026-11-29)."""
        query_lens, context_lens, slots = step.query_lens, step.context_lens, step.slots
        # the one-token rows before the first prompt (none where there is no prompt)
        rows = next((b for b, n in enumerate(query_lens) if n != 1), 0)
        tables = torch.from_numpy(step.tables)
        meta = self._metadata(query_lens[rows:], context_lens[rows:], tables[rows:], slots[rows:])
        if rows:
            meta.decode = self._metadata(query_lens[:rows], context_lens[:rows], tables[:rows], slots[:rows])
        return host_tensor(step.token_ids, torch.long, self.device), host_tensor(step.positions, torch.long,
                                                                                  self.device), meta

    def _metadata(self, query_lens: list[int], context_lens: list[int], tables: torch.Tensor,
                  slots: list[int]) -> AttentionMetadata:
        seq_lens = [start + n for start, n in zip(context_lens, query_lens)]
        return AttentionMetadata(
            query_start_loc=host_tensor(list(accumulate(query_lens, initial=0)), torch.int32, self.device),
            context_lens=host_tensor(context_lens, torch.int32, self.device),
            seq_lens=host_tensor(seq_lens, torch.int32, self.device),
            block_tables=to_device(tables, self.device),
            slot_mapping=host_tensor(slots, torch.int64, self.device),
            block_size=self.block_size,
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
            query_lens_host=query_lens,
            seq_lens_host=seq_lens,
        )

    @torch.inference_mode()
    def profile_activation_bytes(self, max_num_tokens: int, max_batch_size: int, context_window: int) -> int:
        """Peak CUDA memory of the largest step (max_num_tokens prompt tokens, no cache); 0 off CUDA."""
        if self.device.type != "cuda":
            return 0
        if self.peers is not None:
            self.peers.profile(max_num_tokens, max_batch_size, context_window)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        lengths = [context_window] * (max_num_tokens // context_window)
        if max_num_tokens % context_window:
            lengths.append(max_num_tokens % context_window)
        input_ids, positions, meta = self.prepare(
            [StepInput([0] * n, 0, [0] * -(-n // self.block_size)) for n in lengths])
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
        if self.peers is not None:
            self.peers.copy_blocks(list(copies))
        src = host_tensor([s for s, _ in copies], torch.long, self.device)
        dst = host_tensor([d for _, d in copies], torch.long, self.device)
        for cache in self.kv_caches:
            cache[:, dst] = cache[:, src]
