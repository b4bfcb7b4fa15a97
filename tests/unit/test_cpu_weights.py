"""runtime/native/models/cpu_weights.py: prepacked bf16 weights, and int8/int4 weight-only copies for small CPU batches."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from runtime.native.cpu.paged_attention import build_kernel
from runtime.native.models import cpu_weights
from runtime.native.models.cpu_weights import INT4_GROUP, MAX_ROWS, quantize_int4, quantize_int8
from tests.engine_harness import collect, hf_greedy, load_hf, request, running_engine
from tests.tiny_models import build_tiny_model


@pytest.fixture(scope="module", autouse=True)
def kernels() -> None:
    assert build_kernel(), "the CPU kernels (runtime/native/cpu/quantized_linear.cpp) did not build"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_rows_round_to_their_channel_scale_and_the_kernel_matches_the_dequantized_product(
        dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    w = torch.randn(96, 64, dtype=dtype)
    q = quantize_int8(w)
    assert q.qweight.dtype == torch.int8 and q.scale.dtype == dtype and q.qweight.abs().max() >= 126
    steps = w.float() / q.scale.float()[:, None]
    assert ((steps - q.qweight.float()).abs() <= 0.5 + 1e-4).all()  # each weight off by at most half a step
    tol = 1e-4 if dtype == torch.float32 else 0.1
    for rows in (1, 2, 3, 5, 8, MAX_ROWS["int8"] + 7):  # one row: 8 tiles a block (6 here: the edge); more: one
        x = torch.randn(rows, 64, dtype=dtype)
        want = torch.nn.functional.linear(x.float(), q.dequantize().float())
        assert torch.allclose(q.matmul(x).float(), want, atol=tol, rtol=0.02)


def test_int4_groups_round_to_their_own_scale_and_the_kernel_matches_the_dequantized_product() -> None:
    torch.manual_seed(0)
    w = torch.randn(48, 2 * INT4_GROUP)
    q = quantize_int4(w)
    groups = w.view(48, 2, INT4_GROUP)
    step = (groups.amax(-1) - groups.amin(-1)) / 15
    error = (q.dequantize() - w).view(48, 2, INT4_GROUP).abs()
    assert (error <= step[..., None] / 2 + 1e-5).all()  # each weight off by at most half its group's step
    for rows in (1, 2, 3, 4, 5, 6, 7, 8, 13):  # the kernel's blocks of rows and tiles, and their edges
        x = torch.randn(rows, 2 * INT4_GROUP)
        assert torch.allclose(q.matmul(x), torch.nn.functional.linear(x, q.dequantize()), atol=1e-4)


def test_int4_bf16_products_match_the_dequantized_product_at_every_row_count() -> None:
    """bf16 rows take the AVX-512 BF16 dot products where the CPU has them: float32 sums of exact products."""
    torch.manual_seed(0)
    w = torch.randn(150, 3 * INT4_GROUP, dtype=torch.bfloat16)  # 10 tiles, the last ragged: blocks of 8, 4, 2 and edges
    q = quantize_int4(w)
    exact = replace(q, scale=q.scale.float(), offset=q.offset.float()).dequantize()  # (q - 8) * scale + offset
    for rows in (1, 2, 3, 4, 5, 7, 8, 17):
        x = torch.randn(rows, 3 * INT4_GROUP, dtype=torch.bfloat16)
        want = torch.nn.functional.linear(x.float(), exact)
        assert ((q.matmul(x).float() - want).abs() <= want.abs() * 2**-8 + 1e-3).all()  # the bf16 output's rounding


def test_products_spread_over_the_cores_match_the_dequantized_product() -> None:
    """With one torch thread, products of over 2M multiply-adds are shared out in chunks with helper threads
    (runtime/native/cpu/spread.cpp); repeated, since a chunk lost or taken twice would show only in some calls."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        w = torch.randn(1000, 4 * INT4_GROUP)  # 63 tiles, the last ragged
        q = quantize_int4(w)
        for rows in (1, 40, 300):
            x = torch.randn(rows, 4 * INT4_GROUP)
            want = torch.nn.functional.linear(x, q.dequantize())
            for _ in range(20):
                assert torch.allclose(q.matmul(x), want, atol=1e-3)
    finally:
        torch.set_num_threads(threads)


def test_int4_keeps_a_q4_1_weight_exactly() -> None:
    """A weight made of GGUF Q4_1 blocks (4-bit values times a scale plus a minimum per 32 inputs, as in the
    default model's projections) comes back unchanged in float32."""
    torch.manual_seed(0)
    q = torch.randint(0, 16, (32, 4, INT4_GROUP)).float()
    q[..., 0], q[..., 1] = 0, 15  # every block spans the full range, as a Q4_1 quantizer makes it
    scale, minimum = torch.rand(32, 4, 1) / 8 + 0.01, torch.randn(32, 4, 1) / 4
    w = (q * scale + minimum).view(32, 4 * INT4_GROUP)
    assert torch.allclose(quantize_int4(w).dequantize(), w, atol=1e-6)


def test_prepacked_bf16_products_equal_f_linear_at_decode_sizes() -> None:
    torch.manual_seed(0)
    w, bias = torch.randn(256, 64, dtype=torch.bfloat16), torch.randn(256, dtype=torch.bfloat16)
    form = cpu_weights.cpu_weight(w, "none")
    assert form.packed is not None and form.quantized is None
    for rows in (1, 4, 16):
        x = torch.randn(rows, 64, dtype=torch.bfloat16)
        assert torch.equal(form.linear(x, w, bias), torch.nn.functional.linear(x, w, bias))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("cpu_weights"), "llama")


@pytest.mark.parametrize(("quantization", "cpu_compile"), [("int8", False), ("int4", False), ("int4", True)])
async def test_quantized_steps_decode_the_tokens_of_the_dequantized_weights(checkpoint: Path, quantization: str,
                                                                            cpu_compile: bool) -> None:
    """Greedy ids of a request whose every step has at most MAX_ROWS["int8"] rows equal transformers' on the
    dequantized weights (int4 projections take an int8 head), eager or (int4, cpu_compile) from the C++ decode step.
    A long prompt's prefill (more rows) runs the float32 weights with int8, the quantized ones with int4, which
    serves every step and keeps no float copy."""
    prompt, long_prompt = [5, 9, 17], list(range(3, 40))
    async with running_engine(checkpoint, cpu_quantization=quantization, cpu_compile=cpu_compile) as engine:
        out = await collect(engine, request("q", prompt, max_tokens=12))
        long_first = (await collect(engine, request("p", long_prompt, max_tokens=1))).tokens[0]
        plain = engine.runner.model.model.layers[0].self_attn.qkv_proj.weight
    hf = load_hf(checkpoint)
    if quantization == "int8":
        assert long_first == hf_greedy(hf, long_prompt, 1)  # 37 rows: the float32 weights, exactly
    with torch.no_grad():
        for name, module in hf.named_modules():
            if isinstance(module, torch.nn.Linear):  # every projection and the output head
                quantize = quantize_int4 if quantization == "int4" and name != "lm_head" else quantize_int8
                module.weight = torch.nn.Parameter(quantize(module.weight).dequantize())
    assert out.tokens[0] == hf_greedy(hf, prompt, 12)
    if quantization == "int4":
        assert long_first == hf_greedy(hf, long_prompt, 1) and plain.numel() == 0


async def test_bf16_engine_decodes_the_same_tokens_with_prepacked_weights(
        checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def greedy() -> list[list[int]]:
        async with running_engine(checkpoint, dtype="bfloat16") as engine:
            return [(await collect(engine, request(str(n), list(range(3, 3 + n)), max_tokens=10))).tokens[0]
                    for n in (2, 9)]

    packed = await greedy()
    monkeypatch.setattr(cpu_weights, "can_prepack", lambda weight: False)
    assert packed == await greedy()


def test_an_eagle_heads_plain_linears_take_the_targets_cpu_forms() -> None:
    """prepare_plain_linears (an EAGLE head's torch nn.Linear layers on CPU): with int4, each layer's products are
    its int4 form's, at any leading shape; float32 without quantization has no faster form and is left as it is."""
    torch.manual_seed(0)
    head = torch.nn.Sequential(torch.nn.Linear(2 * INT4_GROUP, 48, bias=False), torch.nn.Linear(48, 40, bias=True))
    x = torch.randn(2, 2, 2 * INT4_GROUP)  # 4 rows: within int8's MAX_ROWS
    plain = head(x)
    assert cpu_weights.prepare_plain_linears(head, "none") == 0 and torch.equal(head(x), plain)
    assert cpu_weights.prepare_plain_linears(head, "int4") > 0
    first, second = head[0], head[1]
    hidden = torch.nn.functional.linear(x, quantize_int4(first.weight.data).dequantize())
    want = torch.nn.functional.linear(hidden, quantize_int8(second.weight.data).dequantize(), second.bias)
    assert torch.allclose(head(x), want, atol=1e-4)  # 48 inputs, not int4's groups of 32: int8 for a few rows
    assert not torch.allclose(head(x), plain, atol=1e-4)
