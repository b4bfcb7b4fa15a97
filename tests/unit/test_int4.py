"""INT4 weight-only checkpoints (runtime/native/models/int4_checkpoint.py): tiny models in the AWQ (GEMM) and GPTQ
layouts, with and without act-order (written by tests/int4_checkpoints.py), load as their dequantized float models
exactly and serve their greedy ids; the reference unpacking matches the formats' packing; unsupported options are
refused before any weight is read."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from runtime.architectures import UnsupportedArchitectureError
from runtime.native.models import load_model
from runtime.native.models.cpu_weights import prepare_cpu_weights, quantize_int4
from runtime.native.models.linear import Linear
from runtime.native.models.int4_checkpoint import (
    AWQ_ORDER,
    dequantize_awq,
    dequantize_gptq,
    unpack_int4,
)
from tests.engine_harness import collect, hf_greedy, load_hf, request, running_engine
from tests.int4_checkpoints import AWQ_PACK_ORDER, pack, write_int4_checkpoint
from tests.tiny_models import build_tiny_model

PROMPT = [5, 17, 42, 99, 7, 150, 3]
LAYOUTS = ("awq", "gptq", "gptq-desc-act")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("int4")


def test_unpacking_reads_each_nibble_where_the_format_puts_it() -> None:
    # AutoAWQ: column 8j + AWQ_ORDER[i] in bits 4i; so the int32 0x76543210 holds columns 0,4,1,5,2,6,3,7 = 0..7 -> ...
    word = torch.tensor([[0x76543210]], dtype=torch.int32)
    assert unpack_int4(word, 1, AWQ_ORDER).tolist() == [[0, 4, 1, 5, 2, 6, 3, 7]]
    assert unpack_int4(word, 0).reshape(-1).tolist() == list(range(8))  # GPTQ: sequential
    assert unpack_int4(torch.tensor([[-1]], dtype=torch.int32), 1).tolist() == [[15] * 8]  # the sign bit is a nibble
    values = torch.randint(0, 16, (16, 24), dtype=torch.int32, generator=torch.Generator().manual_seed(1))
    assert torch.equal(unpack_int4(pack(values, 1, AWQ_PACK_ORDER), 1, AWQ_ORDER), values)
    assert torch.equal(unpack_int4(pack(values, 0), 0), values)


def test_the_reference_dequantization_follows_each_formats_zero_point_convention() -> None:
    q = torch.tensor([[3, 15, 0, 8, 1, 2, 4, 5]] * 8, dtype=torch.int32)  # [in 8, out 8]
    scales = torch.full((1, 8), 0.5, dtype=torch.float16)
    zeros = torch.full((1, 8), 8, dtype=torch.int32)
    awq = dequantize_awq(pack(q, 1, AWQ_PACK_ORDER), pack(zeros, 1, AWQ_PACK_ORDER), scales)
    # W is [out, in]: output 0 reads 3 from every input row, output 1 reads 15
    assert awq[0].tolist() == [-2.5] * 8 and awq[1].tolist() == [3.5] * 8  # (3 - 8) * 0.5, (15 - 8) * 0.5
    g_idx = torch.zeros(8, dtype=torch.int32)
    assert torch.equal(dequantize_gptq(pack(q, 0), pack(zeros - 1, 1), scales, g_idx), awq)  # stored minus one
    assert torch.equal(dequantize_gptq(pack(q, 0), pack(zeros, 1), scales, g_idx, v2=True), awq)


@pytest.mark.parametrize("layout", LAYOUTS)
async def test_an_int4_checkpoint_serves_its_dequantized_models_greedy_ids(root: Path, layout: str) -> None:
    source = build_tiny_model(root, "llama-untied")
    quantized, plain = write_int4_checkpoint(source, root, layout)  # type: ignore[arg-type]
    ours, reference = load_model(str(quantized)), load_model(str(plain))
    for (name, got), (_, want) in zip(ours.named_parameters(), reference.named_parameters(), strict=True):
        assert torch.equal(got, want), name  # dequantized at load, exactly
    original = load_model(str(source))
    assert not torch.equal(ours.get_parameter("model.layers.0.mlp.down_proj.weight"),
                           original.get_parameter("model.layers.0.mlp.down_proj.weight"))  # it is quantized
    async with running_engine(quantized) as engine:
        out = await collect(engine, request(layout, PROMPT, 12))
    assert out.tokens[0] == hf_greedy(load_hf(plain), PROMPT, 12)


async def test_an_int4_moe_checkpoint_serves_its_dequantized_models_greedy_ids(root: Path) -> None:
    quantized, plain = write_int4_checkpoint(build_tiny_model(root, "qwen3_moe"), root, "gptq")
    async with running_engine(quantized) as engine:
        out = await collect(engine, request("int4-moe", PROMPT, 12))
    assert out.tokens[0] == hf_greedy(load_hf(plain), PROMPT, 12)


@pytest.mark.parametrize(("layout", "group"), [("awq", 64), ("gptq", 32)])
def test_cpu_int4_keeps_the_checkpoints_own_4_bit_values(root: Path, layout: str, group: int) -> None:
    """--cpu-quantization int4 on an AWQ/GPTQ checkpoint serves the stored values (to float32 rounding), where
    quantizing the dequantized weight again in groups of 32 would move them."""
    quantized, plain = write_int4_checkpoint(build_tiny_model(root, "llama-untied"), root, layout, group=group)
    ours, reference = load_model(str(quantized)), dict(load_model(str(plain)).named_parameters())
    weights = {name: module.weight.detach().clone() for name, module in ours.named_modules()
               if isinstance(module, Linear) and module.int4_grid is not None}
    assert len(weights) == 2 * 4  # qkv, o, gate_up, down in each of 2 layers (the output head is not INT4)
    prepare_cpu_weights(ours, "int4")
    for name, weight in weights.items():
        form = ours.get_submodule(name).cpu_weight
        torch.testing.assert_close(form.quantized.dequantize(), reference[f"{name}.weight"], rtol=1e-6, atol=1e-7)
        assert not torch.allclose(quantize_int4(weight).dequantize(), weight, rtol=1e-6, atol=1e-7)  # requantized


@pytest.mark.parametrize(("layout", "group"), [("awq", 64), ("gptq", 32)])
async def test_an_int4_checkpoint_under_cpu_int4_serves_its_dequantized_models_greedy_ids(
        root: Path, layout: str, group: int) -> None:
    quantized, plain = write_int4_checkpoint(build_tiny_model(root, "llama-untied"), root, layout, group=group)
    async with running_engine(quantized, cpu_quantization="int4") as engine:
        out = await collect(engine, request(layout, PROMPT, 12))
    assert out.tokens[0] == hf_greedy(load_hf(plain), PROMPT, 12)


def test_the_cpu_says_once_that_it_dequantizes(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    quantized, _ = write_int4_checkpoint(build_tiny_model(root, "llama"), root, "gptq-desc-act")
    with caplog.at_level(logging.INFO, logger="runtime.native.models.int4_checkpoint"):
        load_model(str(quantized))
    lines = [r.getMessage() for r in caplog.records if r.name == "runtime.native.models.int4_checkpoint"]
    assert lines == ["GPTQ INT4 checkpoint: 14 projections dequantized to torch.float32 at load "
                     "(INT4 kernels: --int4-kernels on CUDA, without act-order)"]  # 2 layers x 7 projections


@pytest.mark.parametrize(("edit", "message"), [
    ({"bits": 8}, "gptq with 8-bit weights is not supported"),
    ({"group_size": 0}, "gptq group_size 0 is not supported"),
    ({"checkpoint_format": "marlin"}, "GPTQ checkpoint_format 'marlin' is not supported"),
    ({"quant_method": "awq", "version": "gemv"}, "AWQ version 'gemv' is not supported"),
    ({"quant_method": "awq", "zero_point": False}, r"AWQ without zero points \(zero_point: false\)"),
])
def test_int4_options_we_do_not_read_are_refused_by_name(root: Path, edit: dict, message: str) -> None:
    quantized, _ = write_int4_checkpoint(build_tiny_model(root, "llama"), root, "gptq")
    folder = root / f"refused-{len(list(root.iterdir()))}"
    shutil.copytree(quantized, folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"].update(edit)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match=message):
        load_model(str(folder))


def test_int4_weights_missing_a_packed_tensor_are_an_error(root: Path) -> None:
    from safetensors.torch import load_file, save_file

    quantized, _ = write_int4_checkpoint(build_tiny_model(root, "llama"), root, "awq")
    folder = root / "no-zeros"
    shutil.copytree(quantized, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["model.layers.1.mlp.down_proj.qzeros"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="INT4 weights missing packed tensors in the checkpoint: "
                                         "model.layers.1.mlp.down_proj"):
        load_model(str(folder))
