"""runtime/cuda/moe.py: the fused MoE kernels (grouped GEMMs over expert-sorted pairs; one-token GEMVs reading only
the chosen experts) against the eager `Experts` (runtime/models/moe.py). On a CUDA machine they run on the GPU,
elsewhere in Triton's interpreter (tests/triton_interpreter.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
from tests.triton_interpreter import RUN_HERE, kernels, run_in_interpreter  # noqa: E402

from runtime.models.moe import Experts, route  # noqa: E402
from runtime.model_spec import MoeSpec  # noqa: E402

if RUN_HERE:
    from runtime.cuda import moe as cuda_moe


def test_kernels_in_triton_interpreter() -> None:
    run_in_interpreter(__file__, passed=7)


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HIDDEN, INTER = 48, 40  # not multiples of the kernels' tiles


def _experts(spec: MoeSpec, seed: int) -> Experts:
    g = torch.Generator().manual_seed(seed)
    experts = Experts(spec, HIDDEN, "silu", torch.float32)
    for param in experts.parameters():
        param.data = (torch.randn(param.shape, generator=g) * 0.3).to(DEVICE)
    return experts


def _routed(spec: MoeSpec, tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, HIDDEN, generator=g).to(DEVICE)
    weights, ids = route(torch.randn(tokens, spec.num_experts, generator=g).to(DEVICE), spec)
    return x, weights, ids


SPECS = {
    "mixtral": MoeSpec(num_experts=8, top_k=2, intermediate_size=INTER),
    "gpt_oss": MoeSpec(num_experts=8, top_k=4, intermediate_size=INTER, routing="topk_softmax", router_bias=True,
                       expert_bias=True, activation="swiglu_clamp"),
}


@kernels
@pytest.mark.parametrize("kind", list(SPECS))
@pytest.mark.parametrize("tokens", [1, 3, 40])
def test_fused_experts_equal_the_eager_experts(kind: str, tokens: int) -> None:
    """One token (the GEMV kernel), three (still GEMV for top-2, grouped for top-4) and forty (grouped GEMMs, every
    expert busy); SiLU, and gpt-oss's clamped SwiGLU with biases."""
    spec = SPECS[kind]
    experts = _experts(spec, seed=tokens)
    x, weights, ids = _routed(spec, tokens, seed=tokens + 1)
    want = Experts.forward(experts, x, weights, ids)
    got = cuda_moe.fused_experts(experts, x, weights, ids)
    assert ((got - want).norm() / want.norm()).item() < 1e-5
    if tokens == 40:
        assert torch.bincount(ids.view(-1), minlength=spec.num_experts).min() > 0


@kernels
def test_experts_without_tokens_are_skipped_and_padding_stores_nothing() -> None:
    """A step whose pairs go to two of eight experts: the other experts' blocks do nothing and every pair's row is
    the eager result."""
    spec = SPECS["mixtral"]
    experts = _experts(spec, seed=9)
    x, weights, _ = _routed(spec, 20, seed=10)
    ids = torch.tensor([[1, 6]] * 20, device=DEVICE)
    sorted_pairs, block_expert, num_sorted = cuda_moe.align(ids, spec.num_experts, cuda_moe.BLOCK_M)
    assert int(num_sorted) == 2 * cuda_moe.BLOCK_M * 2  # 20 pairs each, padded to 32 rows
    assert block_expert[:4].tolist() == [1, 1, 6, 6]
    valid = sorted_pairs[: int(num_sorted)]
    assert sorted(valid[valid < 40].tolist()) == list(range(40))
    want = Experts.forward(experts, x, weights, ids)
    got = cuda_moe.fused_experts(experts, x, weights, ids)
    assert ((got - want).norm() / want.norm()).item() < 1e-5
