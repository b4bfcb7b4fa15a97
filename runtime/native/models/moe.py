"""Mixture-of-experts MLP (Mixtral, Qwen3-MoE, gpt-oss): a router picks each token's top-k experts, whose SwiGLU
outputs are summed with the router's weights.

Every expert's weights are stored once, stacked: `gate_up_proj` [E, 2I, H] (each expert's gate rows, then its up
rows), `down_proj` [E, H, I], and for gpt-oss their biases. Checkpoints give them per expert (Mixtral's w1/w3/w2,
Qwen3-MoE's gate/up/down_proj: `expert_target` names the slice each fills) or stacked already (transformers 5's
layout; gpt-oss's own, transposed and with gate and up interleaved: gpt_oss.py converts it).

A step groups its tokens by expert: the (token, expert) pairs sorted by expert, one matmul pair per expert that has
tokens, then each token's weighted sum. On CUDA the fused Triton kernels (runtime/native/cuda/moe.py) replace `Experts`'s
forward: no loop over experts there.

Under tensor parallelism every rank holds every expert, each with its slice of the intermediate size (`share`:
gate/up rows column-parallel, down_proj columns row-parallel): the simplest split, with every rank busy on every
token whatever the routing; the ranks' partial sums meet in one all-reduce at the end of MoE.forward.
"""

from __future__ import annotations

import dataclasses
import re

import torch
import torch.nn.functional as F
from torch import nn

from runtime.model_spec import ModelSpec, MoeSpec
from runtime.native.models.activation import get_activation
from runtime.native.models.linear import Linear
from runtime.native.parallel.group import current

# per-expert checkpoint tensors: (layer path).experts.(expert).(kind).weight
_PER_EXPERT = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<expert>\d+)\.(?P<kind>w1|w2|w3|gate_proj|up_proj|down_proj)"
                         r"\.weight$")
_KINDS = {"w1": ("gate_up_proj", "gate"), "gate_proj": ("gate_up_proj", "gate"), "w3": ("gate_up_proj", "up"),
          "up_proj": ("gate_up_proj", "up"), "w2": ("down_proj", ""), "down_proj": ("down_proj", "")}


def expert_target(name: str) -> tuple[str, str] | None:
    """(our stacked parameter, part) for a per-expert checkpoint tensor: part "3.gate" is expert 3's gate rows of
    gate_up_proj, "3" its slice of down_proj. None for other names."""
    match = _PER_EXPERT.match(name)
    if match is None:
        return None
    param, half = _KINDS[match["kind"]]
    part = match["expert"] + (f".{half}" if half else "")
    return f"{match['prefix']}.{param}", part


def route(logits: torch.Tensor, moe: MoeSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 weights, int64 expert ids), each [T, top_k], from the router's logits [T, E], as transformers
    computes them for the model (see MoeSpec.routing)."""
    if moe.routing == "topk_softmax":
        top, ids = torch.topk(logits, moe.top_k, dim=-1)
        return torch.softmax(top.float(), dim=-1), ids
    top, ids = torch.topk(torch.softmax(logits.float(), dim=-1), moe.top_k, dim=-1)
    if moe.renormalize:
        top = top / top.sum(dim=-1, keepdim=True)
    return top, ids


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """gpt-oss's activation: gate clamped above at `limit`, up to +-limit, (up + 1) * gate * sigmoid(alpha * gate)."""
    gate = gate.clamp(max=limit)
    return (up.clamp(-limit, limit) + 1) * (gate * torch.sigmoid(gate * alpha))


class Experts(nn.Module):
    """The stacked weights of every expert (module docstring) and the grouped product over a step's tokens."""

    def __init__(self, moe: MoeSpec, hidden: int, hidden_act: str, dtype: torch.dtype) -> None:
        """`moe`: this rank's experts, of its share of the intermediate size (the whole outside tensor parallelism),
        `share` (start, size) within the checkpoint's."""
        super().__init__()
        self.share = current().share(moe.intermediate_size, "experts' intermediate size")
        moe = dataclasses.replace(moe, intermediate_size=self.share[1])
        self.moe = moe
        experts, inter = moe.num_experts, moe.intermediate_size

        def param(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)

        self.gate_up_proj = param(experts, 2 * inter, hidden)
        self.down_proj = param(experts, hidden, inter)
        self.gate_up_proj_bias = param(experts, 2 * inter) if moe.expert_bias else None
        self.down_proj_bias = param(experts, hidden) if moe.expert_bias else None
        self.act = get_activation(hidden_act)

    def activation(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The gated activation of gate_up [N, 2I] -> [N, I]."""
        gate, up = gate_up.chunk(2, dim=-1)
        if self.moe.activation == "swiglu_clamp":
            return clamped_swiglu(gate, up, self.moe.alpha, self.moe.limit)
        return self.act(gate) * up

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """sum over k of weights[t, k] * expert[ids[t, k]](x[t]), for x [T, H]: the pairs sorted by expert, one
        matmul pair per expert that has tokens (a compiled CPU decode step: `gathered`, which has no loop)."""
        if torch.compiler.is_compiling():
            return self.gathered(x, weights, ids)
        top_k = ids.shape[1]
        order = ids.view(-1).argsort(stable=True)
        counts = torch.bincount(ids.view(-1), minlength=self.moe.num_experts).tolist()
        tokens = order // top_k
        rows = x.index_select(0, tokens)
        out = torch.empty_like(rows)
        start = 0
        for expert, count in enumerate(counts):
            if count:
                end = start + count
                b13 = None if self.gate_up_proj_bias is None else self.gate_up_proj_bias[expert]
                b2 = None if self.down_proj_bias is None else self.down_proj_bias[expert]
                h = self.activation(F.linear(rows[start:end], self.gate_up_proj[expert], b13))
                out[start:end] = F.linear(h, self.down_proj[expert], b2)
                start = end
        weighted = (out.float() * weights.view(-1)[order, None]).to(x.dtype)
        return torch.zeros_like(x).index_add_(0, tokens, weighted)

    def gathered(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """`forward` as batched products over each (token, expert) pair's own weights, gathered: no host sync and no
        loop, for a few tokens (runtime/native/cpu/compiled_decode.py)."""
        tokens, top_k = ids.shape
        pairs = ids.reshape(-1)
        rows = x.repeat_interleave(top_k, dim=0)[:, :, None]  # [P, H, 1]
        h = torch.bmm(self.gate_up_proj[pairs], rows).squeeze(-1)
        if self.gate_up_proj_bias is not None:
            h = h + self.gate_up_proj_bias[pairs]
        y = torch.bmm(self.down_proj[pairs], self.activation(h)[:, :, None]).squeeze(-1)
        if self.down_proj_bias is not None:
            y = y + self.down_proj_bias[pairs]
        weighted = (y.float() * weights.reshape(-1, 1)).to(x.dtype)
        return weighted.view(tokens, top_k, -1).sum(dim=1)

    def load(self, attr: str, tensor: torch.Tensor, part: str | None) -> None:
        """Copy a checkpoint tensor into `attr`, or into one expert's slice of it (`part`: see expert_target)."""
        target = getattr(self, attr).data
        tensor = self._take(attr, tensor, part)
        if part is not None:
            expert, _, half = part.partition(".")
            target = target[int(expert)]
            if half:
                inter = self.moe.intermediate_size
                target = target[:inter] if half == "gate" else target[inter:]
        if target.shape != tensor.shape:
            raise ValueError(f"shape mismatch for experts.{attr}[{part}]: checkpoint {tuple(tensor.shape)}, "
                             f"model {tuple(target.shape)}")
        target.copy_(tensor)

    def _take(self, attr: str, tensor: torch.Tensor, part: str | None) -> torch.Tensor:
        """This rank's slice of a checkpoint tensor (stacked, or one expert's `part`); the tensor outside tensor
        parallelism."""
        tp = current()
        if tp.size == 1:
            return tensor
        if attr == "down_proj":  # [E, H, I] or one expert's [H, I]: the columns of this rank's share
            return tensor.narrow(-1, *self.share)
        if attr == "down_proj_bias":  # added once: on the first rank
            return tensor if tp.rank == 0 else torch.zeros_like(tensor)
        if part is not None and "." in part:  # one expert's gate or up rows [I, H]
            return tensor.narrow(0, *self.share)
        # stacked gate_up_proj [E, 2I, H] or its bias [E, 2I]: the share of the gates, then of the ups
        dim = 1 if part is None else 0
        gate, up = tensor.chunk(2, dim=dim)
        return torch.cat((gate.narrow(dim, *self.share), up.narrow(dim, *self.share)), dim=dim)

    def expected_parts(self, attr: str) -> set[str | None]:
        """The parts that fill `attr` when a checkpoint gives it per expert."""
        if attr == "gate_up_proj":
            return {f"{e}.{half}" for e in range(self.moe.num_experts) for half in ("gate", "up")}
        if attr == "down_proj":
            return {str(e) for e in range(self.moe.num_experts)}
        return {None}


class MoE(nn.Module):
    """Router (`gate`, a Linear over the experts) and `experts`."""

    def __init__(self, moe: MoeSpec, spec: ModelSpec, dtype: torch.dtype) -> None:
        super().__init__()
        self.moe = moe
        self.gate = Linear(spec.hidden_size, [("gate", moe.num_experts)], bias=moe.router_bias, dtype=dtype)
        self.experts = Experts(moe, spec.hidden_size, spec.hidden_act, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = route(self.gate(x), self.moe)
        return current().all_reduce(self.experts(x, weights, ids))
