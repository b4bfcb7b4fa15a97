"""Triton kernels of runtime/native/cuda vs the eager reference code.

On a CUDA machine they run on the GPU; without CUDA in Triton's interpreter (tests/triton_interpreter.py).
Skipped when Triton is absent.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
from tests.triton_interpreter import RUN_HERE, kernels, run_in_interpreter  # noqa: E402

from runtime.native.attention_metadata import AttentionMetadata  # noqa: E402
from runtime.native.models.attention import torch_paged_attention  # noqa: E402
from runtime.native.models.kv_scales import KvScales  # noqa: E402
from runtime.native.models.norm import RMSNorm  # noqa: E402
from runtime.native.models.rotary_embedding import RopeConfig, RotaryEmbedding  # noqa: E402

if RUN_HERE:
    from runtime.native.cuda import fused
    from runtime.native.cuda.fused import rope_decode_attention, rope_store_kv
    from runtime.native.cuda.swiglu import silu_and_mul
    from runtime.native.cuda.norms import add_rms_norm, rms_norm
    from runtime.native.cuda.gemv import gemv
    from runtime.native.cuda.paged_attention import (PREFILL_TILE, PrefillTile, decode_attention, prefill_tile,
                                                     prefill_tiles, store_kv, triton_paged_attention)


def test_kernels_in_triton_interpreter() -> None:
    run_in_interpreter(__file__, passed=38)


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
H, HKV, D, BS, NUM_BLOCKS = 8, 2, 32, 4, 64


def _meta(query_lens: list[int], context_lens: list[int], tables: list[list[int]], bs: int = BS) -> AttentionMetadata:
    seq_lens = [q + c for q, c in zip(query_lens, context_lens)]
    slots = [t[p // bs] * bs + p % bs for q, c, t in zip(query_lens, context_lens, tables) for p in range(c, c + q)]
    width = max(len(t) for t in tables)
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)

    def tensor(values: list, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=DEVICE)

    return AttentionMetadata(
        tensor(starts, torch.int32), tensor(context_lens, torch.int32), tensor(seq_lens, torch.int32),
        tensor([t + [0] * (width - len(t)) for t in tables], torch.int32), tensor(slots, torch.int64),
        bs, max(query_lens), max(seq_lens), list(query_lens), seq_lens,
    )


def _case(query_lens: list[int], context_lens: list[int], seed: int, num_blocks: int = NUM_BLOCKS):
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(num_blocks, generator=g).tolist()  # blocks out of order
    tables, used = [], 0
    for q, c in zip(query_lens, context_lens):
        n = -(-(q + c) // BS)
        tables.append(order[used : used + n])
        used += n
    tokens = sum(query_lens)
    cache = torch.randn(2, num_blocks, BS, HKV, D, generator=g).to(DEVICE)
    q, k, v = (torch.randn(tokens, h, D, generator=g).to(DEVICE) for h in (H, HKV, HKV))
    return q, k, v, cache, _meta(query_lens, context_lens, tables)


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: torch.Tensor,
               meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
    """Store K/V at their slots, then causal attention per sequence in float64 over its gathered cache."""
    cache = cache.clone()
    flat = cache.view(2, -1, HKV, D)
    flat[0, meta.slot_mapping] = k
    flat[1, meta.slot_mapping] = v
    out, start = [], 0
    for b, (n, seq_len) in enumerate(zip(meta.query_lens_host, meta.seq_lens_host)):
        pos = torch.arange(seq_len, device=DEVICE)
        slots = meta.block_tables[b].long()[pos // BS] * BS + pos % BS
        keys, values = (flat[i, slots].double().repeat_interleave(H // HKV, dim=1) for i in (0, 1))  # [S, H, D]
        scores = torch.einsum("qhd,shd->hqs", q[start : start + n].double(), keys) * D**-0.5
        q_pos = torch.arange(seq_len - n, seq_len, device=DEVICE)
        scores = scores.masked_fill(pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        out.append(torch.einsum("hqs,shd->qhd", scores.softmax(-1), values))
        start += n
    return torch.cat(out).to(q.dtype), cache


@kernels
@pytest.mark.parametrize(
    ("query_lens", "context_lens"),
    [([5, 1, 70, 3], [0, 9, 2, 13]), ([1, 1, 1], [0, 17, 40]), ([130], [0]),
     ([3, 1, 6, 4, 7, 2], [40, 38, 32, 16, 24, 70])],
    ids=["prefill-mixed", "decode", "one-long-prompt", "verify-rows-beside-prompt-tails"],
)
def test_paged_attention_matches_reference(query_lens: list[int], context_lens: list[int]) -> None:
    q, k, v, cache, meta = _case(query_lens, context_lens, seed=len(query_lens))
    ref, ref_cache = _reference(q, k, v, cache, meta)
    our_cache = cache.clone()
    out = triton_paged_attention(q, k, v, our_cache, meta, D**-0.5)
    assert torch.equal(our_cache, ref_cache)  # the same K/V stored at the same slots, nothing else touched
    assert ((out - ref).norm() / ref.norm()).item() < 1e-5


@kernels
def test_a_row_gets_the_same_bits_from_the_prefill_kernel_as_from_the_decode_kernel() -> None:
    """Rows over several key tiles (up to 300 keys) in a step with a multi-token row (prefill kernel) equal, bit for
    bit, the same rows each decoded alone (decode kernel): a verification's rows or a prompt joining a step do not
    change what a row attends to, so greedy speculation stays equal to plain decoding (an H200 run saw the two
    kernels part past 64 keys when their key tiles differed)."""
    query_lens, context_lens = [1, 4, 1], [299, 250, 130]
    q, k, v, cache, meta = _case(query_lens, context_lens, seed=5, num_blocks=256)
    out = triton_paged_attention(q, k, v, cache, meta, D**-0.5)  # stores the step's K/V, then the prefill kernel
    row = 0
    for b, (n, context) in enumerate(zip(query_lens, context_lens)):
        table = meta.block_tables[b].tolist()
        for i in range(n):
            alone = _meta([1], [context + i], [table])  # the row as a decode step sees it: keys up to itself
            assert torch.equal(decode_attention(q[row : row + 1], cache, alone, D**-0.5), out[row : row + 1]), (b, i)
            row += 1


@kernels
def test_padded_decode_rows_store_nothing_and_return_zeros() -> None:
    q, k, v, cache, meta = _case([1, 1], [6, 9], seed=7)
    meta.slot_mapping[1] = -1  # what a padded row of a replayed CUDA graph carries
    meta.seq_lens[1] = 0
    ours = cache.clone()
    out = triton_paged_attention(q, k, v, ours, meta, D**-0.5)
    assert torch.count_nonzero(out[1]) == 0
    changed = (ours != cache).flatten(3).any(-1)  # [2, blocks, block_size]: which K/V rows were written
    assert changed.sum().item() == 2  # K and V of row 0's single new token, nothing else


@kernels
def test_prefill_padded_to_a_graph_bucket_equals_the_unpadded_step() -> None:
    """A prefill graph's step (runtime/native/cuda/prefill_graphs.py): 70 new tokens over 9 cached, padded to 192
    rows with KV slot -1 and a tile for every BLOCK_M rows; the real rows get the unpadded result, padding stores
    nothing."""
    q, k, v, cache, meta = _case([70], [9], seed=3)
    ref, ref_cache = _reference(q, k, v, cache, meta)
    pad = 192 - 70
    padded = [torch.cat((t, torch.randn(pad, *t.shape[1:], device=DEVICE))) for t in (q, k, v)]
    meta.slot_mapping = torch.cat((meta.slot_mapping, torch.full((pad,), -1, device=DEVICE)))
    meta.query_lens_host, meta.max_query_len = [192], 192
    offsets = list(range(0, 192, PREFILL_TILE.block_m))
    meta.derived["triton_prefill_tiles"] = (torch.tensor([[0] * len(offsets), offsets], dtype=torch.int32,
                                                         device=DEVICE), PREFILL_TILE)
    ours = cache.clone()
    out = triton_paged_attention(*padded, ours, meta, D**-0.5)
    assert torch.equal(ours, ref_cache)
    assert ((out[:70] - ref).norm() / ref.norm()).item() < 1e-5


@kernels
def test_prefill_tiles() -> None:
    assert prefill_tiles([5, 130, 64], 64) == ([0, 1, 1, 1, 2], [0, 128, 64, 0, 0])  # the most keys first
    # 16-bit queries of head size 128 take the wider tile; float32 (twice the shared memory) and other sizes the default
    assert prefill_tile(128, torch.bfloat16) == PrefillTile(128, 8, 3) == prefill_tile(128, torch.float16)
    assert prefill_tile(128, torch.float32) == prefill_tile(64, torch.bfloat16) == PREFILL_TILE


@kernels
@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 tiles of head size 128: the GPU's (the interpreter's "
                                                          "bf16 products are not the GPU's)")
def test_the_wide_prefill_tile_of_head_size_128_keeps_the_decode_kernels_bits() -> None:
    """The 16-bit head-size-128 tile (128 query rows a program): rows of a prompt beside one-token rows equal, bit for
    bit, the same rows decoded alone (the decode kernel is checked against the reference above)."""
    heads, kv_heads, head_dim, bs = 32, 8, 128, 16
    g = torch.Generator().manual_seed(11)
    query_lens, context_lens = [1, 300, 1], [170, 20, 257]
    tables, used = [], 0
    for n, c in zip(query_lens, context_lens):
        blocks = -(-(n + c) // bs)
        tables.append(list(range(used, used + blocks)))
        used += blocks
    cache = torch.randn(2, used, bs, kv_heads, head_dim, generator=g).to(torch.bfloat16).to(DEVICE)
    tokens = sum(query_lens)
    q, k, v = (torch.randn(tokens, h, head_dim, generator=g).to(torch.bfloat16).to(DEVICE)
               for h in (heads, kv_heads, kv_heads))
    meta = _meta(query_lens, context_lens, tables, bs)
    out = triton_paged_attention(q, k, v, cache, meta, head_dim**-0.5)
    assert meta.derived["triton_prefill_tiles"][1] == PrefillTile(128, 8, 3)
    row = 0
    for b, (n, context) in enumerate(zip(query_lens, context_lens)):
        for i in range(n):
            if i in (0, n // 2, n - 1):
                alone = _meta([1], [context + i], [tables[b]], bs)
                assert torch.equal(decode_attention(q[row: row + 1], cache, alone, head_dim**-0.5), out[row: row + 1])
            row += 1


@kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_elementwise_kernels_match_modules(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    tol = 0 if dtype == torch.float32 else 3e-2  # bf16: a rounding step apart at most
    norm = RMSNorm(96, 1e-5, dtype=dtype).to(DEVICE)
    norm.weight.data = torch.randn(96, generator=g).to(DEVICE, dtype)
    x = torch.randn(5, 96, generator=g).to(DEVICE, dtype)
    torch.testing.assert_close(rms_norm(x, norm.weight, norm.eps), norm(x), rtol=tol, atol=tol + 1e-6)
    residual = torch.randn(5, 96, generator=g).to(DEVICE, dtype)
    total, normed = add_rms_norm(x, residual, norm.weight, norm.eps)
    torch.testing.assert_close(total, x + residual, rtol=tol, atol=tol + 1e-6)  # the residual stream itself
    torch.testing.assert_close(normed, norm(x + residual), rtol=tol, atol=tol + 1e-6)

    rotary = RotaryEmbedding(16, 64, RopeConfig(10000.0, "default", {})).to(DEVICE)
    qkv = torch.randn(5, 3 * 16 + 2 * 16 + 2 * 16, generator=g).to(DEVICE, dtype)
    q, k, v = qkv.split([48, 32, 32], dim=-1)  # strided views, as the fused q/k/v projection gives
    positions = torch.tensor([0, 3, 7, 63, 5], device=DEVICE)
    cache = torch.zeros(2, 4, 2, 2, 16, device=DEVICE, dtype=dtype)  # 8 slots of 2 KV heads
    got_q = rope_store_kv(positions, q, k, v, rotary.cos_cache, rotary.sin_cache, 16, cache,
                          torch.tensor([6, 0, 3, 7, 1], device=DEVICE))
    want_q, want_k = rotary(positions, q, k)
    torch.testing.assert_close(got_q, want_q, rtol=tol, atol=tol + 1e-6)
    torch.testing.assert_close(cache[0].view(8, 32)[[6, 0, 3, 7, 1]], want_k, rtol=tol, atol=tol + 1e-6)

    gate_up = torch.randn(5, 80, generator=g).to(DEVICE, dtype)
    want = torch.nn.functional.silu(gate_up[:, :40]) * gate_up[:, 40:]
    torch.testing.assert_close(silu_and_mul(gate_up), want, rtol=tol, atol=tol + 1e-6)


@kernels
def test_rope_and_kv_store_in_one_kernel_equal_rope_then_store() -> None:
    """rope_store_kv: the eager module's rotated q, and in the cache what store_kv writes for the eager module's
    rotated k and the token's v; a slot of -1 stores nothing."""
    g = torch.Generator().manual_seed(1)
    rotary = RotaryEmbedding(D, 128, RopeConfig(10000.0, "default", {})).to(DEVICE)
    qkv = torch.randn(4, (H + 2 * HKV) * D, generator=g).to(DEVICE)
    q, k, v = qkv.split([H * D, HKV * D, HKV * D], dim=-1)
    positions = torch.tensor([0, 5, 17, 100], device=DEVICE)
    slots = torch.tensor([3, 40, -1, 77], device=DEVICE)
    cache = torch.randn(2, NUM_BLOCKS, BS, HKV, D, generator=g).to(DEVICE)
    want_q, want_k = rotary(positions, q, k)
    want_cache = cache.clone()
    store_kv(want_k.view(4, HKV, D), v.view(4, HKV, D), want_cache, slots)
    got_cache = cache.clone()
    got_q = rope_store_kv(positions, q, k, v, rotary.cos_cache, rotary.sin_cache, D, got_cache, slots)
    torch.testing.assert_close(got_q, want_q, rtol=0, atol=1e-6)  # the same roundings (FMA may move the last bit)
    torch.testing.assert_close(got_cache, want_cache, rtol=0, atol=1e-6)  # nothing else touched


def _bf16_close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Within a bf16 rounding step or two: one on a GPU; Triton's interpreter casts to bf16 by truncation, so
    there a fused chain of casts may land a few steps low."""
    step = 2**-7 if torch.cuda.is_available() else 2**-5
    scale = want.float().abs().mean().item()
    return bool(((got.float() - want.float()).abs() <= step * (want.float().abs() + scale)).all())


@kernels
def test_one_token_projections_equal_the_eager_modules_they_fuse() -> None:
    """gemv (runtime/native/cuda/gemv.py) with each fused prologue and epilogue vs the eager composition in bf16: the
    same roundings, so at most one bf16 step apart (the dot product's float32 sums come in another order)."""
    g = torch.Generator().manual_seed(2)
    bf = torch.bfloat16

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(DEVICE, bf)

    x, weight, bias, residual = rand(1, 96), rand(40, 96), rand(40), rand(1, 40)
    linear = lambda v: torch.nn.functional.linear(v.float(), weight.float()).to(bf)  # noqa: E731 - float32 sums
    assert _bf16_close(gemv(x, weight), linear(x))
    with_bias = torch.nn.functional.linear(x.float(), weight.float(), bias.float()).to(bf)  # as cuBLAS: one rounding
    assert _bf16_close(gemv(x, weight, bias), with_bias)
    norm = RMSNorm(96, 1e-5, dtype=bf).to(DEVICE)
    norm.weight.data = rand(96)
    assert _bf16_close(gemv(x, weight, norm=(norm.weight, norm.eps)), linear(norm(x)))
    assert _bf16_close(gemv(x, weight, residual=residual), residual + linear(x))
    gate, up = linear(x).split(20, dim=-1)  # the weight as a fused gate/up: 20 pairs
    assert _bf16_close(gemv(x, weight, glu=True), torch.nn.functional.silu(gate) * up)
    wide = rand(300, 1100)  # rows and columns past a tile's edge
    v = rand(1, 1100)
    assert _bf16_close(gemv(v, wide), torch.nn.functional.linear(v.float(), wide.float()).to(bf))


@kernels
@pytest.mark.parametrize("tokens", [2, 4])
def test_each_token_of_a_multi_token_gemv_has_the_bits_of_its_own_call(tokens: int) -> None:
    """gemv of 2-4 tokens reads each weight tile once for all of them, and gives each token exactly what a call for
    that token alone gives (so verification rows and plain decoding's one row sum alike), with each fused prologue
    and epilogue, past a tile's edge in rows and columns."""
    g = torch.Generator().manual_seed(3)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(DEVICE, torch.float16)

    weight, bias, norm_weight = rand(6, 1100), rand(6), rand(1100)  # two row tiles (the second partial), two of K
    x, residual = rand(tokens, 1100), rand(tokens, 6)
    calls = [dict(), dict(bias=bias), dict(norm=(norm_weight, 1e-5)), dict(residual=residual),
             dict(norm=(norm_weight, 1e-5), glu=True)]  # glu: 3 gate/up pairs, the second tile's partial
    for fused_ops in calls:
        together = gemv(x, weight, **fused_ops)
        for t in range(tokens):
            alone = {key: value[t : t + 1] if key == "residual" else value for key, value in fused_ops.items()}
            assert torch.equal(together[t : t + 1], gemv(x[t : t + 1], weight, **alone)), (fused_ops, t)
    logits = gemv(x, weight, out=torch.empty(tokens, 6, dtype=torch.float32, device=DEVICE))
    assert torch.equal(logits[1:2], gemv(x[1:2], weight, out=torch.empty(1, 6, dtype=torch.float32, device=DEVICE)))


@kernels
def test_a_one_token_step_through_fused_projections_equals_the_unfused_step(tmp_path, monkeypatch) -> None:
    """A tiny bf16 Llama's one-token decode step over a filled cache: the GEMV path (four kernels a layer, the
    norms, SwiGLU and residual adds inside) gives the hidden state the general fused path gives, and its logits
    those of cuBLAS."""
    from runtime.native.models import load_model
    from tests.tiny_models import build_tiny_model

    model = load_model(str(build_tiny_model(tmp_path, "llama")), torch.bfloat16, torch.device(DEVICE))
    fused.use_fused_kernels(model)
    inner = model.model
    assert fused.one_token_projections(inner)
    g = torch.Generator().manual_seed(4)
    spec = model.spec
    caches = [torch.randn(2, NUM_BLOCKS, BS, spec.num_kv_heads, spec.head_dim, generator=g).to(DEVICE, torch.bfloat16)
              for _ in inner.layers]
    meta = _meta([1], [11], [[5, 2, 9]])
    ids, positions = torch.tensor([7], device=DEVICE), torch.tensor([11], device=DEVICE)
    fast = inner(ids, positions, caches, meta)
    monkeypatch.setattr(fused, "one_token_projections", lambda _: False)
    general = inner(ids, positions, caches, meta)
    assert ((fast.float() - general.float()).norm() / general.float().norm()).item() < 2e-2
    logits = model.compute_logits(fast)  # one row: the GEMV writes float32 logits
    assert logits.dtype == torch.float32
    assert _bf16_close(logits.to(torch.bfloat16), type(model).compute_logits(model, fast).to(torch.bfloat16))


@kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_norms", [False, True])
def test_rope_and_decode_attention_in_one_kernel_equal_the_two_kernels(dtype: torch.dtype, head_norms: bool) -> None:
    """rope_decode_attention: the same bits, in the output and in the cache, as rope_store_kv then
    decode_attention, over several key tiles (plain decoding goes through the first, speculation's verified tokens
    through the second), with and without q/k head norms in them; a padded row (slot -1, length 0) stores nothing
    and gives zeros; in bf16 on a GPU, the stored K is the eager module's."""
    g = torch.Generator().manual_seed(6)
    norms = None
    if head_norms:
        norms = (RMSNorm(D, 1e-6, dtype=dtype).to(DEVICE), RMSNorm(D, 1e-6, dtype=dtype).to(DEVICE))
        for norm in norms:
            norm.weight.data = torch.randn(D, generator=g).to(DEVICE, dtype)
    query_lens, context_lens = [1, 1, 1], [150, 7, 0]
    _, _, _, cache, meta = _case(query_lens, context_lens, seed=6, num_blocks=128)
    cache = cache.to(dtype)
    meta.slot_mapping[2], meta.seq_lens[2] = -1, 0
    rotary = RotaryEmbedding(D, 256, RopeConfig(10000.0, "default", {})).to(DEVICE)
    qkv = torch.randn(3, (H + 2 * HKV) * D, generator=g).to(DEVICE, dtype)
    q, k, v = qkv.split([H * D, HKV * D, HKV * D], dim=-1)  # strided views, as the fused projection gives
    positions = torch.tensor(context_lens, device=DEVICE)
    want_cache = cache.clone()
    rotated = rope_store_kv(positions, q, k, v, rotary.cos_cache, rotary.sin_cache, D, want_cache, meta.slot_mapping,
                            norms)
    want = decode_attention(rotated.view(3, H, D), want_cache, meta, D**-0.5).view(3, H * D)
    got_cache = cache.clone()
    got = rope_decode_attention(positions, q, k, v, rotary.cos_cache, rotary.sin_cache, got_cache, meta, D**-0.5,
                                norms=norms)
    assert torch.equal(got_cache, want_cache)
    assert torch.equal(got, want)
    assert torch.count_nonzero(got[2]) == 0
    if torch.cuda.is_available() and dtype == torch.bfloat16 and not head_norms:  # the interpreter truncates bf16
        _, eager_k = rotary(positions, q, k)  # the eager module's K, bit for bit
        assert torch.equal(got_cache[0].view(-1, HKV * D)[meta.slot_mapping[:2]], eager_k[:2])


@kernels
def test_rope_decode_kernel_stores_the_rows_before_it_that_continue_its_sequence() -> None:
    """A step continuing one sequence by three rows (a verification's: each attends over the ones before it), after
    a sequence that shares its first blocks and is one token shorter, then a padded row: rope_decode_attention gives
    the bits of rope_store_kv then decode_attention, in the output and the cache. (Each program stores its sequence's
    earlier rows' K and V too, the same bits, so its reads do not depend on when their programs run; the other
    sequence's row, at the position before the first of them, is told apart by its slot.)"""
    g = torch.Generator().manual_seed(16)
    shared = [5, 9, 2]
    tables = [shared + [20], shared + [7], shared + [7], shared + [7], [0]]
    meta = _meta([1, 1, 1, 1, 1], [12, 13, 14, 15, 0], tables)
    meta.slot_mapping[4], meta.seq_lens[4] = -1, 0
    cache = torch.randn(2, NUM_BLOCKS, BS, HKV, D, generator=g).to(DEVICE)
    rotary = RotaryEmbedding(D, 64, RopeConfig(10000.0, "default", {})).to(DEVICE)
    q, k, v = torch.randn(5, (H + 2 * HKV) * D, generator=g).to(DEVICE).split([H * D, HKV * D, HKV * D], dim=-1)
    positions = torch.tensor([12, 13, 14, 15, 0], device=DEVICE)
    want_cache = cache.clone()
    rotated = rope_store_kv(positions, q, k, v, rotary.cos_cache, rotary.sin_cache, D, want_cache, meta.slot_mapping)
    want = decode_attention(rotated.view(5, H, D), want_cache, meta, D**-0.5).view(5, H * D)
    got_cache = cache.clone()
    got = rope_decode_attention(positions, q, k, v, rotary.cos_cache, rotary.sin_cache, got_cache, meta, D**-0.5)
    assert torch.equal(got_cache, want_cache)
    assert torch.equal(got, want)


@kernels
@pytest.mark.parametrize("window", [6, 130])
@pytest.mark.parametrize(
    ("query_lens", "context_lens"),
    [([5, 1, 70, 3], [0, 9, 2, 13]), ([1, 1, 1], [0, 17, 300]), ([3, 1, 6], [140, 200, 0])],
    ids=["prefill-mixed", "decode", "verify-rows"],
)
def test_sliding_windows_and_sinks_match_the_reference_backend(query_lens: list[int], context_lens: list[int],
                                                              window: int) -> None:
    """A sliding window (6: inside one key tile; 130: across tiles) and attention sinks (gpt-oss), in the decode and
    the prefill kernel alike, equal the reference backend (runtime/native/models/attention.py)."""
    q, k, v, cache, meta = _case(query_lens, context_lens, seed=11, num_blocks=256)
    sinks = torch.randn(H, generator=torch.Generator().manual_seed(12)).to(DEVICE)
    ref = torch_paged_attention(q, k, v, cache.clone(), meta, D**-0.5, window, sinks)
    out = triton_paged_attention(q, k, v, cache.clone(), meta, D**-0.5, window, sinks)
    assert ((out - ref).norm() / ref.norm()).item() < 1e-5


@kernels
def test_a_windowed_row_gets_the_same_bits_from_either_kernel() -> None:
    """As test_a_row_gets_the_same_bits_from_the_prefill_kernel_as_from_the_decode_kernel, with a window that
    starts inside a key tile and sinks: both kernels start a row at the same aligned tile."""
    query_lens, context_lens = [1, 4, 1], [299, 250, 130]
    q, k, v, cache, meta = _case(query_lens, context_lens, seed=13, num_blocks=256)
    sinks = torch.randn(H, generator=torch.Generator().manual_seed(14)).to(DEVICE)
    out = triton_paged_attention(q, k, v, cache, meta, D**-0.5, 100, sinks)
    row = 0
    for b, (n, context) in enumerate(zip(query_lens, context_lens)):
        table = meta.block_tables[b].tolist()
        for i in range(n):
            alone = _meta([1], [context + i], [table])
            got = decode_attention(q[row : row + 1], cache, alone, D**-0.5, 100, sinks)
            assert torch.equal(got, out[row : row + 1]), (b, i)
            row += 1


@kernels
def test_rope_decode_kernel_takes_windows_and_sinks() -> None:
    """rope_decode_attention with a window and sinks: the bits of rope_store_kv then decode_attention."""
    g = torch.Generator().manual_seed(15)
    query_lens, context_lens = [1, 1], [150, 7]
    _, _, _, cache, meta = _case(query_lens, context_lens, seed=15, num_blocks=128)
    rotary = RotaryEmbedding(D, 256, RopeConfig(10000.0, "default", {})).to(DEVICE)
    q, k, v = torch.randn(2, (H + 2 * HKV) * D, generator=g).to(DEVICE).split([H * D, HKV * D, HKV * D], dim=-1)
    sinks = torch.randn(H, generator=g).to(DEVICE)
    positions = torch.tensor(context_lens, device=DEVICE)
    want_cache = cache.clone()
    rotated = rope_store_kv(positions, q, k, v, rotary.cos_cache, rotary.sin_cache, D, want_cache, meta.slot_mapping)
    want = decode_attention(rotated.view(2, H, D), want_cache, meta, D**-0.5, 20, sinks).view(2, H * D)
    got = rope_decode_attention(positions, q, k, v, rotary.cos_cache, rotary.sin_cache, cache.clone(), meta,
                                D**-0.5, 20, sinks)
    assert torch.equal(got, want)


@kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_kernels_follow_gemma_and_gpt_oss_conventions(dtype: torch.dtype) -> None:
    """(1 + weight) in float32 (Gemma) and weight before the cast back (gpt-oss), as RMSNorm computes them."""
    g = torch.Generator().manual_seed(16)
    tol = 1e-6 if dtype == torch.float32 else 3e-2  # float32: the mean's sums in another order
    x = torch.randn(5, 96, generator=g).to(DEVICE, dtype)
    residual = torch.randn(5, 96, generator=g).to(DEVICE, dtype)
    for offset, in_float32 in ((1.0, True), (0.0, True)):
        norm = RMSNorm(96, 1e-6, dtype=dtype, offset=offset, weight_in_float32=in_float32).to(DEVICE)
        norm.weight.data = torch.randn(96, generator=g).to(DEVICE, dtype)
        torch.testing.assert_close(rms_norm(x, norm.weight, norm.eps, offset, in_float32), norm(x), rtol=tol,
                                   atol=tol + 1e-6)
        _, normed = add_rms_norm(x, residual, norm.weight, norm.eps, offset, in_float32)
        torch.testing.assert_close(normed, norm(x + residual), rtol=tol, atol=tol + 1e-6)


@kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rope_kernel_norms_each_head_first(dtype: torch.dtype, offset: float) -> None:
    """rope_store_kv with q/k head norms (Qwen3's convention, and Gemma's (1 + weight) in float32) from strided views
    of a fused q/k/v output: the eager modules' norms then RoPE, in q and in the cache's K, within a rounding step
    (the norm's sum of squares in another order)."""
    g = torch.Generator().manual_seed(17)
    rotary = RotaryEmbedding(D, 128, RopeConfig(10000.0, "default", {})).to(DEVICE)
    qkv = torch.randn(3, (H + 2 * HKV) * D, generator=g).to(DEVICE, dtype)
    q, k, v = qkv.split([H * D, HKV * D, HKV * D], dim=-1)
    norms = [RMSNorm(D, eps, dtype=dtype, offset=offset).to(DEVICE) for eps in (1e-6, 1e-5)]
    for norm in norms:
        norm.weight.data = torch.randn(D, generator=g).to(DEVICE, dtype)
    positions, slots = torch.tensor([0, 5, 100], device=DEVICE), torch.tensor([3, 40, 77], device=DEVICE)
    cache = torch.zeros(2, NUM_BLOCKS, BS, HKV, D, device=DEVICE, dtype=dtype)
    got_q = rope_store_kv(positions, q, k, v, rotary.cos_cache, rotary.sin_cache, D, cache, slots,
                          (norms[0], norms[1]))
    want_q, want_k = rotary(positions, norms[0](q.reshape(3, H, D)).view(3, -1),
                            norms[1](k.reshape(3, HKV, D)).view(3, -1))
    got_k = cache[0].view(-1, HKV * D)[slots]
    for got, want in ((got_q, want_q), (got_k, want_k)):
        if dtype == torch.float32:
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        else:
            assert _bf16_close(got, want)


FP8_SCALES = KvScales(4.5, 3.25)  # not powers of two: E4M3's grid lands elsewhere than at scale 1


def _on_grid(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Values an FP8 cache of `scale` holds exactly (E4M3 values times the scale, exact in float32), so storing them
    rounds nothing: Triton's interpreter rounds some casts to E4M3 wrongly (126.2 -> 64; triton-lang/triton#11897),
    which these tests are not about."""
    return (x / scale).to(torch.float8_e4m3fn).float() * scale


def _fp8_case(query_lens: list[int], context_lens: list[int], seed: int):
    """_case with keys and values well past E4M3's 448 (scale 1 saturates them; queries smaller by as much, so the
    scores stay the same) and an FP8 cache holding the context at FP8_SCALES."""
    q, k, v, cache, meta = _case(query_lens, context_lens, seed, num_blocks=256)
    stored = torch.cat(((cache[:1] * 300 / FP8_SCALES.k), (cache[1:] * 200 / FP8_SCALES.v))).to(torch.float8_e4m3fn)
    return q / 300, _on_grid(k * 300, FP8_SCALES.k), _on_grid(v * 200, FP8_SCALES.v), stored, meta


@kernels
@pytest.mark.parametrize(("query_lens", "context_lens"), [([5, 1, 70, 3], [0, 9, 2, 13]), ([1, 1, 1], [0, 17, 140])],
                         ids=["prefill-mixed", "decode"])
def test_an_fp8_cache_with_scales_matches_the_reference_backend(query_lens: list[int], context_lens: list[int]) -> None:
    """--kv-cache-dtype fp8 with a checkpoint's scales: the store kernel writes the reference's E4M3 bytes of
    K / k_scale and V / v_scale, and the prefill and decode kernels read them back times the scales, as the reference
    backend (runtime/native/models/attention.py) does; without the scales the output is another."""
    q, k, v, cache, meta = _fp8_case(query_lens, context_lens, seed=21)
    want_cache, got_cache = cache.clone(), cache.clone()
    want = torch_paged_attention(q, k, v, want_cache, meta, D**-0.5, kv_scales=FP8_SCALES)
    got = triton_paged_attention(q, k, v, got_cache, meta, D**-0.5, kv_scales=FP8_SCALES)
    assert torch.equal(got_cache.view(torch.uint8), want_cache.view(torch.uint8))
    assert ((got - want).norm() / want.norm()).item() < 1e-5
    unscaled = triton_paged_attention(q, k, v, cache.clone(), meta, D**-0.5)
    assert ((unscaled - want).norm() / want.norm()).item() > 1e-2


@kernels
def test_the_fused_rope_kernels_store_and_read_an_fp8_cache_through_its_scales() -> None:
    """rope_store_kv stores K / k_scale and V / v_scale (at position 0, where RoPE leaves K as it is: the exact E4M3
    bytes), and rope_decode_attention gives the bits of rope_store_kv then decode_attention with the scales."""
    g = torch.Generator().manual_seed(22)
    query_lens, context_lens = [1, 1], [150, 7]
    _, _, _, cache, meta = _fp8_case(query_lens, context_lens, seed=22)
    rotary = RotaryEmbedding(D, 256, RopeConfig(10000.0, "default", {})).to(DEVICE)
    q, k, v = torch.randn(2, (H + 2 * HKV) * D, generator=g).to(DEVICE).split([H * D, HKV * D, HKV * D], dim=-1)
    q, k, v = q / 300, _on_grid(k * 300, FP8_SCALES.k), _on_grid(v * 200, FP8_SCALES.v)
    at_zero = cache.clone()
    rope_store_kv(torch.zeros(2, dtype=torch.long, device=DEVICE), q, k, v, rotary.cos_cache, rotary.sin_cache, D,
                  at_zero, meta.slot_mapping, kv_scales=FP8_SCALES)
    stored = at_zero.view(2, -1, HKV * D)[:, meta.slot_mapping]
    assert torch.equal(stored[0].view(torch.uint8), (k / FP8_SCALES.k).to(torch.float8_e4m3fn).view(torch.uint8))
    assert torch.equal(stored[1].view(torch.uint8), (v / FP8_SCALES.v).to(torch.float8_e4m3fn).view(torch.uint8))
    positions = torch.tensor(context_lens, device=DEVICE)
    want_cache = cache.clone()
    rotated = rope_store_kv(positions, q, k, v, rotary.cos_cache, rotary.sin_cache, D, want_cache,
                            meta.slot_mapping, kv_scales=FP8_SCALES)
    want = decode_attention(rotated.view(2, H, D), want_cache, meta, D**-0.5, kv_scales=FP8_SCALES).view(2, H * D)
    got_cache = cache.clone()
    got = rope_decode_attention(positions, q, k, v, rotary.cos_cache, rotary.sin_cache, got_cache, meta, D**-0.5,
                                kv_scales=FP8_SCALES)
    assert torch.equal(got_cache.view(torch.uint8), want_cache.view(torch.uint8))
    assert torch.equal(got, want)


@kernels
def test_each_row_of_a_few_token_step_has_the_bits_of_its_own_one_token_step(tmp_path) -> None:
    """Three one-token rows in one step (a decode graph's rows: a small batch, or one sequence's verification rows)
    run their projections as GEMVs of three tokens: each row's hidden state and float32 logits equal, bit for bit,
    those of a step of that row alone (what makes greedy speculation exact in 16 bits)."""
    from runtime.native.models import load_model
    from tests.tiny_models import build_tiny_model

    model = load_model(str(build_tiny_model(tmp_path, "llama")), torch.bfloat16, torch.device(DEVICE))
    fused.use_fused_kernels(model)
    inner, spec = model.model, model.spec
    g = torch.Generator().manual_seed(5)
    caches = [torch.randn(2, NUM_BLOCKS, BS, spec.num_kv_heads, spec.head_dim, generator=g).to(DEVICE, torch.bfloat16)
              for _ in inner.layers]
    tables, contexts = [[5, 2, 9], [1, 3], [4, 6, 8]], [11, 6, 9]
    ids, positions = torch.tensor([7, 3, 12], device=DEVICE), torch.tensor(contexts, device=DEVICE)
    together = inner(ids, positions, [c.clone() for c in caches], _meta([1, 1, 1], contexts, tables))
    logits = model.compute_logits(together)
    for r in range(3):
        alone = inner(ids[r : r + 1], positions[r : r + 1], [c.clone() for c in caches],
                      _meta([1], contexts[r : r + 1], tables[r : r + 1]))
        assert torch.equal(together[r : r + 1], alone), r
        assert torch.equal(logits[r : r + 1], model.compute_logits(alone)), r
