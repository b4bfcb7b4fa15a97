"""runtime/native/cuda/moe.py: the fused MoE kernels (grouped GEMMs over expert-sorted pairs; one-token GEMVs reading only
the chosen experts) against the eager `Experts` (runtime/native/models/moe.py), and runtime/native/cuda/one_token_moe.py's MoE
layer for one token against the eager router, experts and residual add. On a CUDA machine they run on the GPU,
elsewhere in Triton's interpreter (tests/triton_interpreter.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")
from tests.triton_interpreter import RUN_HERE, kernels, run_in_interpreter  # noqa: E402

from runtime.native.models.moe import MoE, Experts, route  # noqa: E402
from runtime.native.models.norm import RMSNorm  # noqa: E402
from runtime.model_spec import MoeSpec  # noqa: E402

if RUN_HERE:
    from runtime.native.cuda import moe as cuda_moe
    from runtime.native.cuda.one_token_moe import one_token_moe


def test_kernels_in_triton_interpreter() -> None:
    run_in_interpreter(__file__, passed=29)


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
@pytest.mark.parametrize("tokens", [1, 3, 40, 300])
def test_fused_experts_equal_the_eager_experts(kind: str, tokens: int) -> None:
    """One token (the GEMV kernel), three (still GEMV for top-2, grouped for top-4), forty (grouped GEMMs, every
    expert busy) and 300 (another tile: 32-row blocks); SiLU, and gpt-oss's clamped SwiGLU with biases."""
    spec = SPECS[kind]
    experts = _experts(spec, seed=tokens)
    x, weights, ids = _routed(spec, tokens, seed=tokens + 1)
    want = Experts.forward(experts, x, weights, ids)
    got = cuda_moe.fused_experts(experts, x, weights, ids)
    assert ((got - want).norm() / want.norm()).item() < 1e-5
    if tokens >= 40:
        assert torch.bincount(ids.view(-1), minlength=spec.num_experts).min() > 0


@kernels
def test_experts_without_tokens_are_skipped_and_padding_stores_nothing() -> None:
    """A step whose pairs go to two of eight experts: the other experts' blocks do nothing and every pair's row is
    the eager result."""
    spec = SPECS["mixtral"]
    experts = _experts(spec, seed=9)
    x, weights, _ = _routed(spec, 20, seed=10)
    ids = torch.tensor([[1, 6]] * 20, device=DEVICE)
    block_m = cuda_moe.gemm_tile(20, torch.float32)[0]
    assert block_m == 16
    sorted_pairs, block_expert, num_sorted = cuda_moe.align(ids, spec.num_experts, block_m)
    assert int(num_sorted) == 2 * block_m * 2  # 20 pairs each, padded to 32 rows
    assert block_expert[:4].tolist() == [1, 1, 6, 6]
    valid = sorted_pairs[: int(num_sorted)]
    assert sorted(valid[valid < 40].tolist()) == list(range(40))
    want = Experts.forward(experts, x, weights, ids)
    got = cuda_moe.fused_experts(experts, x, weights, ids)
    assert ((got - want).norm() / want.norm()).item() < 1e-5


@kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_every_tile_of_the_grouped_gemms_gives_the_eager_result(dtype: torch.dtype,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Each of GEMM_TILES' tiles (as float32 fits them; float16 takes them whole, as bfloat16 does) on 40 tokens of
    gpt-oss's experts: blocks of up to 128 rows, most of them padding, and tiles wider than the matrices."""
    spec = SPECS["gpt_oss"]
    experts = _experts(spec, seed=20).to(dtype)
    x, weights, ids = _routed(spec, 40, seed=21)
    x = x.to(dtype)
    want = Experts.forward(experts, x, weights, ids).float()
    for _, tile in cuda_moe.GEMM_TILES:
        monkeypatch.setattr(cuda_moe, "gemm_tile",
                            lambda tokens, dtype, memory, tile=tile: cuda_moe.fit_tile(tile, dtype, memory))
        got = cuda_moe.fused_experts(experts, x, weights, ids).float()
        assert ((got - want).norm() / want.norm()).item() < (1e-5 if dtype == torch.float32 else 2e-3), tile


ONE_TOKEN_SPECS = {
    **SPECS,
    # softmax over every expert without renormalising (Qwen3-MoE's norm_topk_prob false); E and k not powers of 2
    "odd": MoeSpec(num_experts=6, top_k=3, intermediate_size=INTER, renormalize=False),
}


def _moe_layer(spec: MoeSpec, dtype: torch.dtype, seed: int) -> tuple[MoE, RMSNorm]:
    g = torch.Generator().manual_seed(seed)
    moe = MoE(spec, SimpleNamespace(hidden_size=HIDDEN, hidden_act="silu"), dtype)  # type: ignore[arg-type]
    norm = RMSNorm(HIDDEN, 1e-6, dtype=dtype)
    for param in [*moe.parameters(), norm.weight]:
        param.data = (torch.randn(param.shape, generator=g) * 0.3 + (param is norm.weight)).to(DEVICE, dtype)
    return moe, norm


@kernels
@pytest.mark.parametrize("kind", list(ONE_TOKEN_SPECS))
# the small down tile changes how the work splits (more counters), not the rounding: float32 is enough there (its
# float16 case was the interpreter run's slowest)
@pytest.mark.parametrize(("down_tile", "dtype"), [(None, torch.float32), (None, torch.float16),
                                                  ((2, 16, 1), torch.float32)])
def test_one_token_moe_layer_equals_the_eager_layer(kind: str, dtype: torch.dtype,
                                                     down_tile: tuple[int, int, int] | None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """x + MoE(RMSNorm(x)) for one token: the router's GEMV, the routing, the chosen experts' gate/up and down
    kernels against the eager modules: routings with and without the softmax first and renormalisation, gpt-oss's
    biases and clamped SwiGLU; three tokens in a row, so the down kernel's counters are reused. The down kernel on
    its own tile (6 tiles of 8 rows of HIDDEN, INTER in one step) and on 2-row tiles over 16 columns (24 tiles, each
    counter reached by k programs; INTER in three steps). float16 rather than bfloat16: the interpreter rounds
    bfloat16 by truncation."""
    from runtime.native.cuda import one_token_moe as otm

    if down_tile is not None:
        monkeypatch.setattr(otm, "DOWN_TILE", down_tile)
    spec = ONE_TOKEN_SPECS[kind]
    moe, norm = _moe_layer(spec, dtype, seed=30)
    for seed in range(3):  # three tokens, three routings
        x = torch.randn(1, HIDDEN, generator=torch.Generator().manual_seed(31 + seed)).to(DEVICE, dtype)
        want = (x + moe(norm(x))).float()
        got = one_token_moe(moe, x, norm).float()
        assert ((got - want).norm() / want.norm()).item() < (1e-5 if dtype == torch.float32 else 1e-3), seed


@kernels
@pytest.mark.parametrize(("experts", "top_k", "tokens", "block_m"),
                         [(128, 8, 256, 32), (6, 3, 300, 128), (128, 8, 1, 16)])
def test_align_puts_each_experts_pairs_in_its_padded_run(experts: int, top_k: int, tokens: int, block_m: int) -> None:
    """Qwen3-30B-A3B's 256-row decode step, a prefill-sized block and a single token: every expert's run starts at
    the padded lengths of the runs before it and holds exactly its pairs (in any order), then padding; each block
    names the expert whose run it is in."""
    g = torch.Generator().manual_seed(40)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)]).to(DEVICE)
    sorted_pairs, block_expert, num_sorted = cuda_moe.align(ids, experts, block_m)
    counts = torch.bincount(ids.view(-1).cpu(), minlength=experts)
    padded = (counts + block_m - 1) // block_m * block_m
    starts = (torch.cumsum(padded, 0) - padded).tolist()
    assert int(num_sorted) == int(padded.sum())
    runs = sorted_pairs.cpu()
    flat = ids.view(-1).cpu()
    for e in range(experts):
        run = runs[starts[e] : starts[e] + int(padded[e])]
        assert sorted(run[: int(counts[e])].tolist()) == torch.nonzero(flat == e).view(-1).tolist(), e
        assert (run[int(counts[e]) :] == ids.numel()).all(), e
        assert (block_expert.cpu()[starts[e] // block_m : (starts[e] + int(padded[e])) // block_m] == e).all(), e
    assert (runs[int(num_sorted) :] == ids.numel()).all()
    assert (block_expert.cpu()[int(num_sorted) // block_m :] == experts - 1).all()  # blocks past the runs


@pytest.mark.parametrize(("shared_memory", "tile"), [
    (232448, (128, 256, 64, 8, 4)),  # H200 (and H100): the table's tile
    (166912, (128, 256, 64, 8, 3)),  # A100: a stage fewer
    (101376, (128, 128, 64, 8, 2)),  # L40S: two stages and half as wide
])
def test_grouped_gemm_tiles_fit_the_gpus_shared_memory(shared_memory: int, tile: tuple[int, ...]) -> None:
    """A prefill chunk's bf16 tile on GPUs with less shared memory than the H200 it was tuned on."""
    from runtime.native.cuda.moe import SHARED_MEMORY_SLACK, gemm_tile

    got = gemm_tile(4096, torch.bfloat16, shared_memory)
    assert got == tile
    block_m, block_n, block_k, _, stages = got
    assert stages * (block_m + block_n) * block_k * 2 + SHARED_MEMORY_SLACK <= shared_memory
    assert gemm_tile(4096, torch.bfloat16) == gemm_tile(4096, torch.bfloat16, 232448)  # no limit: the table's


if RUN_HERE:
    import triton

    from runtime.native.cuda.one_token_moe import _route_kernel


@kernels
@pytest.mark.parametrize("kind", list(ONE_TOKEN_SPECS))
def test_the_kernels_top_k_picks_routes_experts_in_its_order_ties_to_the_lower_id(kind: str) -> None:
    """The routing kernel against `route`: the same ids slot by slot and the same weights on random
    logits; on logits with ties, equal values in the order of their ids; unused slots id 0 and weight 0."""
    spec = ONE_TOKEN_SPECS[kind]
    g = torch.Generator().manual_seed(40)
    block_e, block_topk = triton.next_power_of_2(spec.num_experts), triton.next_power_of_2(spec.top_k)
    tied = torch.tensor([1.0, 3.0, 3.0, -2.0, 3.0, 1.0, 0.5, 3.0])[: spec.num_experts]
    tied = tied.to(DEVICE)
    for logits in (torch.randn(spec.num_experts, generator=g).to(DEVICE), tied):
        ids = torch.full((block_topk,), -1, dtype=torch.int32, device=DEVICE)
        weights = torch.full((block_topk,), -1.0, device=DEVICE)
        _route_kernel[(1,)](logits, ids, weights, E=spec.num_experts, BLOCK_E=block_e, TOP_K=spec.top_k,
                            BLOCK_TOPK=block_topk, SOFTMAX_FIRST=spec.routing == "softmax_topk",
                            RENORMALIZE=spec.renormalize, PDL=False)
        want_weights, want_ids = route(logits[None], spec)
        order = sorted(range(spec.num_experts), key=lambda e: (-logits[e].item(), e))[: spec.top_k]
        assert ids[: spec.top_k].tolist() == order
        if logits is not tied:  # torch.topk orders equal values as it likes
            assert ids[: spec.top_k].tolist() == want_ids[0].tolist()
        assert torch.allclose(weights[: spec.top_k], want_weights[0].float(), rtol=1e-6, atol=1e-7)
        assert ids[spec.top_k:].tolist() == [0] * (block_topk - spec.top_k)
        assert weights[spec.top_k:].tolist() == [0.0] * (block_topk - spec.top_k)
