"""Compiled decode steps on CPU: the model's whole decode forward through torch.compile (inductor's C++ backend).

Why: a decode step of a small model is about 60 small operators per layer. Run eagerly, each costs a Python
dispatch and a kernel call that does little work; at one stream that is most of the step. Inductor fuses the
norms, RoPE, SwiGLU and residual adds into a few C++ loops per layer, calls the quantized products and
attention as external kernels, and (cpp_wrapper) drives them all from generated C++, so a step is one call.
It cannot call our prepacked bf16 products (its lowering of them takes only weights it packed itself, and
it packed none here), so the engine compiles only where the one-row step has none: with --cpu-quantization,
or a float32 model. It is the CPU's counterpart of the CUDA graphs (runtime/native/cuda/graphs.py)
and takes the same decode-shaped rows (runtime/native/cuda/graphs.py's pack_rows).

- Row counts: only ROW_COUNTS are compiled, one graph each, while eager steps serve (`warm_up`, from
  runtime/native/cpu/warm_up.py); other steps run eagerly.
- The attention span (blocks gathered per row) is dynamic, so one graph serves every sequence length; it is
  at least MIN_BLOCKS blocks (the mask hides the padding), since torch would specialise a one-block span.
- The KV write is one `index_put_` into each layer's cache tensor (runtime/native/models/attention.py): written
  through a view of the cache, as the eager path does, inductor would copy the whole cache.
- The attention inputs (blocks to gather, the mask) are made outside the graph, so nothing in it depends on a
  Python value that changes from step to step; guards are not evaluated per step (they hold by construction).
  Should a step still need a new graph, it runs eagerly instead of stalling serving for a compile, and the
  compiled path is turned off with a warning.
- Inductor keeps its generated code in its on-disk cache ($TORCHINDUCTOR_CACHE_DIR), so a restart compiles
  faster. Steps with a LoRA adapter run eagerly.
- A step hands out the final hidden states beside the logits (an EAGLE head's input: the head's product reads them
  anyway, so keeping them costs nothing).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from runtime.native.attention_metadata import AttentionMetadata
from runtime.native.decode_rows import (
    IDS,
    LENGTHS,
    PACKED_ROWS,
    POSITIONS,
    SLOTS,
    DecodeOutput,
    fill_pending,
    fit_rows,
    pack_rows,
)
from runtime.native.models.attention import decode_inputs

if TYPE_CHECKING:
    from runtime.native.block_tables import BlockTables
    from runtime.native.lora.apply import LoraBatch
    from runtime.native.models import CausalLM
    from runtime.native.step_inputs import StepInputs

logger = logging.getLogger(__name__)
MIN_BLOCKS = 2
# Row counts compiled: one stream's decode step, where per-operator overhead is most of the step. With more
# rows it is shared by them, and compiling lost here (SmolLM2 int4, 1 thread, RESULTS.md): a static 16-row
# graph took 92 ms a step against 78 ms eager; graphs with a dynamic row count 2-3x eager's time.
ROW_COUNTS = (1,)


class CompiledDecode:
    """`model`'s decode-shaped steps of `row_counts` rows, compiled (see the module docstring)."""

    hands_out_hidden = True  # DecodeOutput.hidden: an EAGLE head's input (runtime/native/speculative/eagle.py)

    def __init__(self, model: CausalLM, kv_caches: list[torch.Tensor], block_size: int, max_blocks_per_seq: int,
                 lora: LoraBatch | None = None, row_counts: tuple[int, ...] = ROW_COUNTS) -> None:
        self.model, self.kv_caches, self.block_size = model, kv_caches, block_size
        self.max_blocks, self.row_counts = max(max_blocks_per_seq, MIN_BLOCKS), row_counts
        self.lora = lora
        self.dtype = next(model.parameters()).dtype
        # freezing: the weights become constants of the graph (18.6 against 19.7 ms a SmolLM2 int4 step);
        # cpp_wrapper: the graph's calls run from generated C++, not from a generated Python function
        self.compiled = torch.compile(self._forward, fullgraph=True, options={"freezing": True, "cpp_wrapper": True})

    def _forward(self, packed: torch.Tensor, blocks: torch.Tensor,
                 bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        meta = AttentionMetadata(  # what decode attention reads; the rest is unread in a decode step
            query_start_loc=packed[LENGTHS], context_lens=packed[LENGTHS], seq_lens=packed[LENGTHS],
            block_tables=blocks, slot_mapping=packed[SLOTS], block_size=self.block_size, max_query_len=1,
            max_seq_len=0, query_lens_host=[], seq_lens_host=[],
        )
        meta.derived[("cpu_decode", self.dtype, packed.device)] = (blocks, bias)
        hidden = self.model(packed[IDS], packed[POSITIONS], self.kv_caches, meta)
        return self.model.compute_logits(hidden), hidden

    def accepts(self, inputs: StepInputs) -> bool:
        """A compiled row count of new tokens, at most MAX_ROWS_PER_SEQ per input, and no adapter."""
        return (fit_rows(inputs, self.max_blocks) and max(inputs.adapter_slots) < 0
                and len(inputs.token_ids) in self.row_counts)

    @torch.inference_mode()
    def run(self, inputs: StepInputs, last_sampled: torch.Tensor | None,
            resident: BlockTables | None = None) -> DecodeOutput:
        """Float32 logits [new tokens, vocab] and the final hidden states (no greedy ids: the sampler takes them).
        `last_sampled`: the previous launch's sampled ids (ModelRunner); `resident`: as for DecodeGraphs.run."""
        columns, tables = pack_rows(inputs, self.block_size, resident)
        packed = torch.from_numpy(columns)
        fill_pending(inputs, packed[IDS], last_sampled)
        logits, hidden = self._step(packed, torch.from_numpy(tables), compile_allowed=False)
        return DecodeOutput(logits, hidden=hidden)

    def _step(self, packed: torch.Tensor, tables: torch.Tensor,
              compile_allowed: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if self.lora is not None:
            self.lora.clear()  # an eager adapter step may have left it on; the graphs run without adapters
        num_blocks = max(-(-int(packed[LENGTHS].max()) // self.block_size), MIN_BLOCKS)
        if tables.shape[1] < num_blocks:
            tables = F.pad(tables, (0, num_blocks - tables.shape[1]))
        blocks, bias = decode_inputs(tables, packed[LENGTHS], num_blocks, self.block_size, self.dtype, packed.device)
        torch._dynamo.mark_dynamic(blocks, 1)
        torch._dynamo.mark_dynamic(bias, 3)
        if compile_allowed:
            return self.compiled(packed, blocks, bias)
        try:
            # only the guards that tell the compiled graphs apart: the others hold by construction (~2 ms a step)
            with torch.compiler.set_stance("fail_on_recompile", skip_guard_eval_unsafe=True):
                return self.compiled(packed, blocks, bias)
        except RuntimeError as exc:
            if "recompile" not in str(exc):
                raise
            logger.warning("CPU compiled decode: a step needs a graph not compiled at start-up; decode steps run "
                           "eagerly from now on (%s)", str(exc).splitlines()[0])
            self.row_counts = ()
            return self._forward(packed, blocks, bias)

    @torch.inference_mode()
    def warm_up(self, scratch_block: int) -> None:
        """Compile the graph of every row count served. The warm-up rows store their K/V in KV block
        `scratch_block`, which no sequence may use: it runs while eager steps serve (runtime/native/cpu/warm_up.py)."""
        started = time.perf_counter()
        for rows in self.row_counts:
            t = time.perf_counter()
            packed = torch.zeros((PACKED_ROWS, rows), dtype=torch.long)
            packed[LENGTHS] = 1
            packed[SLOTS] = scratch_block * self.block_size
            tables = torch.full((rows, MIN_BLOCKS), scratch_block, dtype=torch.int32)
            self._step(packed, tables, compile_allowed=True)
            logger.info("CPU compiled decode: %d row%s in %.1f s", rows, "s" if rows > 1 else "", time.perf_counter() - t)
        logger.info("CPU compiled decode: %d graphs (rows %s) in %.1f s", len(self.row_counts),
                    ",".join(map(str, self.row_counts)), time.perf_counter() - started)
