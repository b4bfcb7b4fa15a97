"""runtime/native/models/cpu_weights.py: prepacked bf16 weights, and int8/int4 weight-only copies for small CPU batches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime.native.models import cpu_weights
from runtime.native.models.cpu_weights import INT4_GROUP, MAX_ROWS, quantize_int4, quantize_int8
from tests.engine_harness import collect, hf_greedy, load_hf, request, running_engine
from tests.tiny_models import build_tiny_model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_rows_round_to_their_channel_scale_and_the_kernel_matches_the_dequantized_product(
        dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    w = torch.randn(96, 64, dtype=dtype)
    q = quantize_int8(w)
    assert q.qweight.dtype == torch.int8 and q.scale.dtype == dtype and q.qweight.abs().max() >= 126
    steps = w.float() / q.scale.float()[:, None]
    assert ((steps - q.qweight.float()).abs() <= 0.5 + 1e-4).all()  # each weight off by at most half a step
    x = torch.randn(MAX_ROWS["int8"], 64, dtype=dtype)
    want = torch.nn.functional.linear(x.float(), q.dequantize().float())
    tol = 1e-4 if dtype == torch.float32 else 0.1
    assert torch.allclose(q.matmul(x).float(), want, atol=tol, rtol=0.02)


def test_int4_groups_round_to_their_own_scale_and_the_kernel_matches_the_dequantized_product() -> None:
    torch.manual_seed(0)
    w = torch.randn(48, 2 * INT4_GROUP)
    q = quantize_int4(w)
    groups = w.view(48, 2, INT4_GROUP)
    step = (groups.amax(-1) - groups.amin(-1)) / 15
    error = (q.dequantize() - w).view(48, 2, INT4_GROUP).abs()
    assert (error <= step[..., None] / 2 + 1e-5).all()  # each weight off by at most half its group's step
    x = torch.randn(MAX_ROWS["int4"], 2 * INT4_GROUP)
    assert torch.allclose(q.matmul(x), torch.nn.functional.linear(x, q.dequantize()), atol=1e-4)


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


@pytest.mark.parametrize("quantization", ["int8", "int4"])
async def test_small_batches_decode_with_the_quantized_weights(checkpoint: Path, quantization: str) -> None:
    """Greedy ids of a request whose every step has at most MAX_ROWS rows equal transformers' on the dequantized
    weights (int4 projections take an int8 head); a long prompt's prefill (more rows) runs the float32 weights."""
    prompt = [5, 9, 17]  # fits MAX_ROWS: the prefill uses the quantized copies too
    async with running_engine(checkpoint, cpu_quantization=quantization) as engine:
        out = await collect(engine, request("q", prompt, max_tokens=12))
        plain_rows = (await collect(engine, request("p", list(range(3, 40)), max_tokens=1))).tokens[0]
    hf = load_hf(checkpoint)
    assert plain_rows == hf_greedy(hf, list(range(3, 40)), 1)  # 37 rows: the float32 weights, exactly
    with torch.no_grad():
        for name, module in hf.named_modules():
            if isinstance(module, torch.nn.Linear):  # every projection and the output head
                quantize = quantize_int4 if quantization == "int4" and name != "lm_head" else quantize_int8
                module.weight = torch.nn.Parameter(quantize(module.weight).dequantize())
    assert out.tokens[0] == hf_greedy(hf, prompt, 12)


async def test_bf16_engine_decodes_the_same_tokens_with_prepacked_weights(
        checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def greedy() -> list[list[int]]:
        async with running_engine(checkpoint, dtype="bfloat16") as engine:
            return [(await collect(engine, request(str(n), list(range(3, 3 + n)), max_tokens=10))).tokens[0]
                    for n in (2, 9)]

    packed = await greedy()
    monkeypatch.setattr(cpu_weights, "can_prepack", lambda weight: False)
    assert packed == await greedy()
