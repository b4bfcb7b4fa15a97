"""EAGLE proposer: the head of eagle_head.py drafts a chain from the target's own hidden states.

The target's runner keeps each step's final hidden states (ModelRunner.keep_hidden): eager steps and the CPU's C++
and compiled decode steps and the CUDA decode and prefill graphs hand them out, so plain, verification and prompts'
steps under EAGLE run as fast as without it (on CUDA a step where prompts join decode rows replays both graphs: the
mixed graphs, which return logits only, are not captured). An EAGLE-3 head
reads the inputs of some of the target's layers too, which the target's forward keeps (LlamaModel.kept_inputs), and
only steps run op by op hand out (the loader then builds no C++ or compiled steps and captures no CUDA graphs).
`observe` copies every sequence's rows into its buffer by position (on CUDA, for a few sequences, a slot of the draft
chain, whose proposals are one graph each: eagle_chain.py).
The head's entry at index i reads (h_i, e(x_{i+1})), so it can be computed once x_{i+1} is known: at a proposal for
a sequence of N tokens, the head first catches up on the indices up to N-2 (its cache keeps them: they are verified
tokens), whose last output drafts token 1; each further draft reads the previous output and the previous draft's
embedding. The chain's entries are dropped afterwards. Rows of rejected drafts in the buffer are overwritten by the
next step, which computes those positions again, before they are read. Embedding and lm_head are the target's.
Proposals are argmax chains, verified as deterministic ones (n-gram's way).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from runtime.native.model_runner import ModelRunner
from runtime.native.models.base import CausalLM
from runtime.native.models.cpu_weights import Quantization, int4_fits, prepare_plain_linears, quantize_int4
from runtime.native.sequence import Sequence, SequenceStatus
from runtime.native.speculative.eagle3 import EAGLE3_ARCHITECTURES, Eagle3Head
from runtime.native.speculative.eagle_chain import EagleChain
from runtime.native.speculative.eagle_head import EagleHead
from runtime.native.step_inputs import StepInputs

# the draft chain's slots hold every position of the context window, and its attention reads (its keys repeated per
# query head) as many as a sequence has, in powers of two: kept to windows of up to 32k positions until measured (a
# head shaped like an 8B target's with a 128k window: ~3 GB of slots, ~1 GB of repeated keys a chained step at the
# end of its window)
CHAIN_MAX_POSITIONS = 32768
_CONFIG_FIELDS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                  "rms_norm_eps", "rope_theta")


def load_head(path: str, dtype: torch.dtype, device: torch.device, target_layers: int) -> EagleHead | Eagle3Head:
    """A head folder: ours (tools/demo_training/train_default_eagle.py: config.json, packed model.safetensors), or a
    published EAGLE-3 checkpoint for a Llama target of `target_layers` layers (eagle3.py)."""
    from safetensors.torch import load_file

    from runtime.demo import unpack_draft

    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise ValueError(f"--draft-model {path}: no config.json there (expected an EAGLE head folder)")
    config = json.loads((folder / "config.json").read_text())
    if set(config.get("architectures") or ()) & EAGLE3_ARCHITECTURES:
        return Eagle3Head.load(folder, config, target_layers, dtype, device)
    if config.get("architectures") != ["EagleHead"]:
        raise ValueError(f"--draft-model {path}: not an EAGLE head (architectures {config.get('architectures')})")
    h, heads, kv, dim, inter, eps, theta = (config[k] for k in _CONFIG_FIELDS)
    head = EagleHead(h, heads, kv, dim, inter, eps, theta)
    head.load_state_dict(unpack_draft(load_file(str(folder / "model.safetensors")), torch.float32))
    return head.to(device=device, dtype=dtype).eval()


@dataclass
class _HeadState:
    """The head's view of one target sequence."""

    seq: Sequence
    first: int  # the first position whose hidden state the target handed out (> 0 after a prefix-cache hit)
    hidden: torch.Tensor  # [capacity, H]: the target's hidden state at each position from `first`
    keys: torch.Tensor  # [kv_heads, capacity, D]: the head's cache, indices from `first`
    values: torch.Tensor
    cached: int  # head entries computed: indices first .. cached-1
    slot: int | None = None  # its EagleChain slot, whose views the tensors above are (None: tensors of its own)

    def ensure(self, positions: int) -> None:
        """Room for positions up to `positions` - 1 (a slot's views have room for every position of the context
        window and a chain after it: EagleProposer's capacity)."""
        need = positions - self.first
        if need <= self.hidden.shape[0]:
            return
        grow = max(need, 2 * self.hidden.shape[0])
        self.hidden = torch.cat([self.hidden, self.hidden.new_zeros(grow - self.hidden.shape[0], self.hidden.shape[1])])
        pad = (self.keys.shape[0], grow - self.keys.shape[1], self.keys.shape[2])
        self.keys = torch.cat([self.keys, self.keys.new_zeros(pad)], dim=1)
        self.values = torch.cat([self.values, self.values.new_zeros(pad)], dim=1)


class EagleProposer:
    """Drafts chains with an EAGLE head over the target's hidden states (see the module docstring)."""

    def __init__(self, path: str, target: CausalLM, runner: ModelRunner, dtype: torch.dtype,
                 device: torch.device, num_draft_tokens: int = 1, chain_slots: int = 0,
                 cpu_quantization: Quantization = "none") -> None:
        self.head: EagleHead | Eagle3Head = load_head(path, dtype, device, len(target.model.layers))  # type: ignore[union-attr,arg-type]
        # the logits a draft is the argmax of: the head's (the target's output head, or an EAGLE-3 head's own)
        self._logits = functools.partial(self.head.logits, target=target)
        if device.type == "cpu":
            # the target's CPU forms (weight-only quantized as it is), whose one-row products are ~3x F.linear's on
            # the head's shapes: a head step of the default model 1.39 -> 0.48 ms (bf16, int4; 2-core box)
            prepare_plain_linears(self.head, cpu_quantization)
            embedding = target.output_embedding()
            if cpu_quantization == "int4" and isinstance(self.head, EagleHead) and int4_fits(embedding):
                # drafts from an int4 copy of the target's output head (int8 for the target's own tokens): only
                # proposals, which verification checks. One row 1.06 -> 0.51 ms; EAGLE 0.70x -> 0.83x (2026-11-30)
                draft_head, vocab = quantize_int4(embedding.detach()), target.spec.vocab_size
                self._logits = lambda out: draft_head.matmul(out)[:, :vocab]
        self.target = target
        self.runner = runner
        runner.keep_hidden = True
        self._states: dict[int, _HeadState] = {}
        # up to `chain_slots` sequences keep their state in static slots and draft through one CUDA graph a proposal
        # (eagle_chain.py; EAGLE heads, not EAGLE-3 ones); the others, and every sequence without CUDA, op by op
        self.chain = None
        # every position and a chain after them, in whole 64s (aligned rows for the attention mask)
        capacity = -(-(target.spec.context_window + num_draft_tokens + 1) // 64) * 64
        if chain_slots and isinstance(self.head, EagleHead) and capacity <= CHAIN_MAX_POSITIONS:
            self.chain = EagleChain(self.head, target, chain_slots, capacity, device, graphs=device.type == "cuda")
        # EAGLE-3 heads: the target's forward keeps these layers' inputs (LlamaModel.layer_inputs)
        if self.head.aux_layers:
            target.model.kept_inputs = frozenset(self.head.aux_layers)  # type: ignore[union-attr]
        self._warm_up(num_draft_tokens + 1, device)
        if self.chain is not None:
            self.chain.warm_up(num_draft_tokens)

    @torch.inference_mode()
    def _warm_up(self, rows: int, device: torch.device) -> None:
        """A catch-up of `rows` indices and a chained step over dummy states, so that the first launch of each of the
        head's kernels (module loading, library handles: tens of ms on a GPU) happens at start-up, not in the first
        speculating steps, which the guard measures against plain ones and would find far behind."""
        head = self.head
        feed = torch.zeros(rows, head.o_proj.out_features, dtype=head.o_proj.weight.dtype, device=device)
        empty = feed.new_zeros(head.kv_heads, 0, head.head_dim)
        ids = torch.zeros(rows, dtype=torch.long, device=device)
        for n in (rows, 1):
            out, _, _, _ = head.extend(feed[:n], head.embed(ids[:n], self.target), 0, empty, empty)
            self._logits(out[-1:]).argmax(dim=-1).tolist()

    @property
    def reads_layer_inputs(self) -> bool:
        """Whether the head reads the inputs of some of the target's layers (EAGLE-3), which only steps run op by op
        hand out."""
        return bool(self.head.aux_layers)

    @property
    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.head.parameters())

    def release_finished(self) -> None:
        for key, state in list(self._states.items()):
            if state.seq.status is not SequenceStatus.RUNNING:
                self._drop(key)

    def _drop(self, seq_id: int) -> None:
        state = self._states.pop(seq_id)
        if state.slot is not None:
            self.chain.free.append(state.slot)  # type: ignore[union-attr]

    def _new_state(self, seq: Sequence, start: int, like: torch.Tensor) -> _HeadState:
        """A sequence's state from position `start`: in a free chain slot where there is one, else its own tensors."""
        head, chain = self.head, self.chain
        if chain is not None and chain.free:  # (its capacity holds every position of the context window)
            slot = chain.free.pop()
            return _HeadState(seq, start, *chain.views(slot, start), start, slot)
        cache = (head.kv_heads, 64, head.head_dim)
        return _HeadState(seq, start, like.new_zeros(64, like.shape[1]), like.new_zeros(cache), like.new_zeros(cache),
                          start)

    @torch.inference_mode()
    def observe(self, seqs: list[Sequence], inputs: StepInputs) -> None:
        """Keep the hidden states of the step just launched (the runner's, by position)."""
        kept = self.runner.hidden
        if kept is None:
            return
        values, first_rows = kept
        if self.head.aux_layers:  # EAGLE-3: the inputs of three of the target's layers, side by side
            layer_inputs = self.target.model.layer_inputs  # type: ignore[union-attr]
            values = torch.cat([layer_inputs[i] for i in self.head.aux_layers], dim=-1)
        values = self.head.feature(values)
        into: list[torch.Tensor] = []
        rows: list[torch.Tensor] = []
        for b, seq in enumerate(seqs):
            start, count = inputs.start_pos[b], inputs.counts[b]
            state = self._states.get(seq.seq_id)
            if state is None or start < state.first:  # new, or recomputed from earlier (preempted)
                if state is not None:
                    self._drop(seq.seq_id)
                state = self._states[seq.seq_id] = self._new_state(seq, start, values)
            state.ensure(start + count)
            into.append(state.hidden[start - state.first : start - state.first + count])
            rows.append(values[first_rows[b] : first_rows[b] + count])
            state.cached = min(state.cached, start)  # entries from `start` on read rows rewritten now
        # every sequence's rows in one multi-tensor copy: a copy each cost ~10 us of host a sequence, every step, which
        # at 32 sequences was most of what EAGLE cost where it did not speculate (H200, 2026-11-29)
        torch._foreach_copy_(into, rows)

    @torch.inference_mode()
    def propose(self, seq: Sequence, k: int) -> list[int]:
        """Up to k drafts after `seq`'s tokens (none before the target handed out its hidden states)."""
        state = self._states.get(seq.seq_id)
        last = seq.num_tokens - 2  # the last index whose hidden state and next token are both known
        if state is None or last < state.first:
            return []
        state.ensure(last + 1 + k)
        if state.slot is not None:  # the chain's graph: the last k+1 indices and the drafts; older ones op by op first
            if state.cached < last - k:
                self._extend(state, last - k - 1)
            chained = self.chain.propose(state.slot, state.first, last, seq.token_ids, k)  # type: ignore[union-attr]
            state.cached = last + 1
            return chained
        head, target, base = self.head, self.target, state.first
        out, feed = self._extend(state, last)
        out, feed = out[-1:], feed[-1:]
        drafts: list[torch.Tensor] = []  # on the device: the host waits once, for the whole chain
        for j in range(k):
            token = self._logits(out).argmax(dim=-1)
            drafts.append(token)
            if j == k - 1:
                break
            at = last + 1 + j  # chain entries: cached past `cached` and overwritten by the next catch-up
            out, feed, keys, values = head.extend(
                feed, head.embed(token, target), at, state.keys[:, : at - base], state.values[:, : at - base])
            state.keys[:, at - base : at + 1 - base] = keys
            state.values[:, at - base : at + 1 - base] = values
        return torch.cat(drafts).tolist()

    def _extend(self, state: _HeadState, last: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's entries state.cached .. `last`, op by op, into its state: (outputs, the states the next chained
        step reads), one row an index."""
        head, base, start = self.head, state.first, state.cached
        tokens = state.seq.token_ids
        out, feed, keys, values = head.extend(
            state.hidden[start - base : last + 1 - base],
            head.embed(torch.tensor(tokens[start + 1 : last + 2], device=state.hidden.device), self.target),
            start, state.keys[:, : start - base], state.values[:, : start - base])
        state.keys[:, start - base : last + 1 - base] = keys
        state.values[:, start - base : last + 1 - base] = values
        state.cached = last + 1
        return out, feed
