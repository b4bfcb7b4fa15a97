"""runtime/models/int8.py: int8 weight-only copies for small CPU batches (--cpu-quantization int8)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime.models.int8 import MAX_ROWS, dequantize, matmul, quantize
from tests.engine_harness import collect, hf_greedy, load_hf, request, running_engine
from tests.tiny_models import build_tiny_model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_round_to_their_channel_scale_and_the_kernel_matches_the_dequantized_product(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    w = torch.randn(96, 64, dtype=dtype)
    q = quantize(w)
    assert q.qweight.dtype == torch.int8 and q.scale.dtype == dtype and q.qweight.abs().max() >= 126
    steps = w.float() / q.scale.float()[:, None]
    assert ((steps - q.qweight.float()).abs() <= 0.5 + 1e-4).all()  # each weight off by at most half a step
    x = torch.randn(MAX_ROWS, 64, dtype=dtype)
    want = torch.nn.functional.linear(x.float(), dequantize(q).float())
    tol = 1e-4 if dtype == torch.float32 else 0.1
    assert torch.allclose(matmul(x, q).float(), want, atol=tol, rtol=0.02)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("int8"), "llama")


async def test_small_batches_decode_with_the_int8_weights(checkpoint: Path) -> None:
    """Greedy ids of a request whose every step has at most MAX_ROWS rows equal transformers' on the dequantized
    weights; a long prompt's prefill (more rows) still runs the original weights."""
    prompt = [5, 9, 17]  # fits MAX_ROWS: the prefill uses the int8 copies too
    async with running_engine(checkpoint, cpu_quantization="int8") as engine:
        out = await collect(engine, request("q", prompt, max_tokens=12))
        plain_rows = (await collect(engine, request("p", list(range(3, 40)), max_tokens=1))).tokens[0]
    hf = load_hf(checkpoint)
    assert plain_rows == hf_greedy(hf, list(range(3, 40)), 1)  # 37 rows: the bf16/fp32 weights, exactly
    with torch.no_grad():
        for module in hf.modules():
            if isinstance(module, torch.nn.Linear):  # every projection and the output head
                module.weight = torch.nn.Parameter(dequantize(quantize(module.weight)))
    assert out.tokens[0] == hf_greedy(hf, prompt, 12)
