"""CausalLM: the base every architecture implements, and what the loader needs from it."""

from __future__ import annotations

import torch
from torch import nn

from runtime.native.attention_metadata import AttentionMetadata
from runtime.model_spec import ModelSpec
from runtime.native.models.cpu_weights import CpuWeight
from runtime.native.parallel.group import current


class CausalLM(nn.Module):
    """A decoder-only LM over packed tokens and a paged KV cache.

    Subclasses build their layers from `spec.config` and describe how checkpoint tensor names map
    onto their parameters (see `checkpoint_target` and `convert_tensor`), so one loader serves all.
    """

    # checkpoint module name -> (our fused module name, part name). E.g. "q_proj" -> ("qkv_proj", "q").
    packed_modules: dict[str, tuple[str, str]] = {}
    # substrings of checkpoint names that carry no weights we use (rotary caches, causal-mask buffers)
    ignored_checkpoint_names: tuple[str, ...] = ()
    tensor_parallel = False  # splits itself over --tensor-parallel-size ranks (runtime/native/parallel/group.py)

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Hidden states [T, hidden] of the T packed new tokens (after the final norm)."""
        raise NotImplementedError

    def output_embedding(self) -> torch.Tensor:
        """The [vocab, hidden] matrix that turns hidden states into logits (the input one when tied)."""
        raise NotImplementedError

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Float32 logits [N, vocab_size] for N hidden states (select the rows you sample first), written
        into `out` when given (the cast to float32 is then that copy: no extra pass). Under tensor parallelism each
        rank's slice of the vocabulary, gathered (a collective: every rank calls it with the same rows)."""
        head: CpuWeight | None = getattr(self, "cpu_head", None)  # prepare_cpu_weights
        if head is not None:
            logits = head.linear(hidden, self.output_embedding(), None)
        else:
            logits = torch.nn.functional.linear(hidden, self.output_embedding())
        cap = self.spec.final_logit_softcap
        if cap:  # Gemma's final softcapping, in the logits' dtype as transformers does it
            logits = torch.tanh(logits / cap) * cap
        logits = current().gather_vocab(logits, self.spec.vocab_size)
        return logits.float() if out is None else out.copy_(logits)

    def checkpoint_target(self, name: str) -> tuple[str, str | None] | None:
        """Our parameter name (and fused part) for a checkpoint tensor name; None to skip it."""
        if any(ignored in name for ignored in self.ignored_checkpoint_names):
            return None
        for ckpt_module, (ours, part) in self.packed_modules.items():
            token = f".{ckpt_module}."
            if token in name:
                return name.replace(token, f".{ours}."), part
        return name, None

    def convert_tensor(self, param_name: str, tensor: torch.Tensor) -> torch.Tensor | None:
        """Layout fix-ups before copying (GPT-2's Conv1D weights are stored transposed); None holds the tensor back
        until the others it combines with are read (gpt-oss's MXFP4 blocks and scales)."""
        return tensor
