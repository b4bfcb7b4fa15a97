"""Decode steps of an int4 Llama-shaped model in one C++ call (runtime/native/cpu/decode_step.cpp): the CPU's default
decode path where the model allows it, in place of the compiled steps (runtime/native/cpu/compiled_decode.py).

Why: the step's ~60 operators per layer cost a Python dispatch each when run eagerly; torch.compile removes them
but spends 60-100 s at every start and serves one row count. This step is ready as soon as the CPU kernels are
built (they are cached), serves any number of decode-shaped rows (one new token per sequence, or a few with
speculation) and reads the int4 weights the eager steps read, with the same kernels; prompts run eagerly.

It takes models whose decoder is the plain Llama one: no biases, head norms, sandwich norms, sliding windows,
attention sinks, experts, scaled embeddings or logit softcapping, SiLU, full-width RoPE, and int4 forms of every
projection with an int8 head (`--cpu-quantization int4`). `supports` names what a model lacks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from runtime.native.decode_rows import (
    IDS,
    DecodeOutput,
    fill_pending,
    fit_rows,
    pack_rows,
)
from runtime.native.models.cpu_weights import Int4Weight, Int8Weight

if TYPE_CHECKING:
    from runtime.native.block_tables import BlockTables
    from runtime.native.lora.apply import LoraBatch
    from runtime.native.models import CausalLM
    from runtime.native.models.linear import Linear
    from runtime.native.step_inputs import StepInputs


def supports(model: CausalLM) -> str | None:
    """None when the C++ step can run `model`, else what stands in the way."""
    from runtime.native.models.llama import LlamaForCausalLM, LlamaMLP

    spec = model.spec
    if not isinstance(model, LlamaForCausalLM):
        return f"{type(model).__name__} is not a Llama-shaped decoder"
    plain = not (spec.qkv_bias or spec.o_bias or spec.qk_norm or spec.norm_offset or spec.norm_weight_in_float32
                 or spec.sandwich_norms or spec.embedding_scaled or spec.attention_sinks or spec.final_logit_softcap
                 or any(w is not None for w in spec.layer_windows))
    if not plain or spec.hidden_act not in ("silu", "swish") or spec.config.get("mlp_bias"):
        return "the model's decoder differs from the plain Llama one"
    rotary = model.model.rotary_emb
    if rotary.rotary_dim != rotary.head_dim or model.model.embed_tokens.weight.dtype not in (torch.float32,
                                                                                            torch.bfloat16):
        return "partial RoPE, or weights neither float32 nor bfloat16"
    head = getattr(model, "cpu_head", None)
    if head is None or not isinstance(head.quantized, Int8Weight):
        return "no int8 output head (--cpu-quantization int4)"
    for layer in model.model.layers:
        if not isinstance(layer.mlp, LlamaMLP):
            return "a mixture-of-experts layer"
        for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            if linear.cpu_weight is None or not isinstance(linear.cpu_weight.quantized, Int4Weight):
                return "a projection without an int4 form"
    return None


def _int4(linear: Linear) -> list[torch.Tensor]:
    form = linear.cpu_weight.quantized  # type: ignore[union-attr]
    assert isinstance(form, Int4Weight)
    return [form.packed, form.scale, form.offset]


class NativeDecode:
    """`model`'s decode-shaped steps through the C++ step; the same interface as CompiledDecode (`accepts`, `run`,
    `hands_out_hidden`)."""

    hands_out_hidden = True  # DecodeOutput.hidden: an EAGLE head's input (runtime/native/speculative/eagle.py)

    def __init__(self, model: CausalLM, kv_caches: list[torch.Tensor], block_size: int, max_blocks_per_seq: int,
                 lora: LoraBatch | None = None) -> None:
        from runtime.native.models.llama import LlamaForCausalLM

        assert isinstance(model, LlamaForCausalLM) and supports(model) is None
        self.kv_caches, self.block_size, self.max_blocks, self.lora = kv_caches, block_size, max_blocks_per_seq, lora
        spec, inner, head = model.spec, model.model, model.cpu_head.quantized  # type: ignore[union-attr]
        assert isinstance(head, Int8Weight)
        self.weights = [inner.embed_tokens.weight, inner.norm.weight, head.tiled, head.scale]
        for layer in inner.layers:
            attention, mlp = layer.self_attn, layer.mlp
            self.weights += [layer.input_layernorm.weight, *_int4(attention.qkv_proj), *_int4(attention.o_proj),
                             layer.post_attention_layernorm.weight, *_int4(mlp.gate_up_proj), *_int4(mlp.down_proj)]
        self.cos, self.sin = inner.rotary_emb.cos_cache, inner.rotary_emb.sin_cache
        self.eps = float(inner.norm.eps)
        self.shape = (spec.attention_scale, spec.num_heads, spec.num_kv_heads, spec.head_dim)

    def accepts(self, inputs: StepInputs) -> bool:
        """Decode-shaped rows (at most MAX_ROWS_PER_SEQ per input) with no adapter."""
        return fit_rows(inputs, self.max_blocks) and max(inputs.adapter_slots) < 0

    @torch.inference_mode()
    def run(self, inputs: StepInputs, last_sampled: torch.Tensor | None,
            resident: BlockTables | None = None) -> DecodeOutput:
        """Float32 logits [new tokens, vocab] and the final hidden states; `last_sampled` and `resident` as for
        CompiledDecode.run."""
        if self.lora is not None:
            self.lora.clear()  # an eager adapter step may have left it on
        columns, tables = pack_rows(inputs, self.block_size, resident)
        rows = torch.from_numpy(columns)
        fill_pending(inputs, rows[IDS], last_sampled)
        scale, heads, kv_heads, head_dim = self.shape
        logits, hidden = torch.ops.trtllm_gateway_cpu.llama_decode_step(
            rows, torch.from_numpy(tables).contiguous(), self.weights, self.kv_caches, self.cos, self.sin, self.eps,
            scale, heads, kv_heads, head_dim)
        return DecodeOutput(logits, hidden=hidden)
