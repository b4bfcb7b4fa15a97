"""FP8 checkpoints (runtime/native/models/fp8_checkpoint.py) and --quantization fp8: tiny models in the compressed-tensors and
ModelOpt layouts (written by tests/fp8_checkpoints.py) serve the greedy ids of their dequantized float models; a
16-bit checkpoint quantized at load holds each projection's per-channel E4M3 values; unsupported schemes are refused
before any weight is read. On the CPU (and GPUs before compute capability 8.9) the engine dequantizes FP8 weights at
load; with ENGINE_TEST_DEVICE=cuda on an H100/H200 the same tests serve them on the FP8 tensor cores."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from runtime.architectures import UnsupportedArchitectureError
from runtime.native.models import load_model
from tests.engine_harness import collect, hf_greedy, load_hf, request, running_engine
from tests.fp8_checkpoints import PROJECTION, to_e4m3, write_fp8_checkpoint
from tests.tiny_models import build_tiny_model

PROMPT = [5, 17, 42, 99, 7, 150, 3]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fp8")


@pytest.mark.parametrize(("layout", "per_channel", "static"), [
    ("compressed-tensors", True, False), ("compressed-tensors", False, True), ("modelopt", False, True),
    ("modelopt", True, False)])
async def test_an_fp8_checkpoint_serves_its_dequantized_models_greedy_ids(root: Path, layout: str, per_channel: bool,
                                                                           static: bool) -> None:
    quantized, plain = write_fp8_checkpoint(build_tiny_model(root, "llama-untied"), root, layout,  # type: ignore[arg-type]
                                            per_channel=per_channel, static=static)
    ours, reference = load_model(str(quantized)), load_model(str(plain))
    for (name, got), (_, want) in zip(ours.named_parameters(), reference.named_parameters(), strict=True):
        assert torch.equal(got, want), name  # on the CPU: dequantized at load, exactly
    async with running_engine(quantized) as engine:
        out = await collect(engine, request("fp8", PROMPT, 12))
    assert out.tokens[0] == hf_greedy(load_hf(plain), PROMPT, 12)


async def test_an_fp8_moe_checkpoint_serves_its_dequantized_models_greedy_ids(root: Path) -> None:
    quantized, plain = write_fp8_checkpoint(build_tiny_model(root, "qwen3_moe"), root, "compressed-tensors")
    async with running_engine(quantized) as engine:
        out = await collect(engine, request("fp8-moe", PROMPT, 12))
    assert out.tokens[0] == hf_greedy(load_hf(plain), PROMPT, 12)


def test_the_cpu_says_once_that_it_dequantizes(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    quantized, _ = write_fp8_checkpoint(build_tiny_model(root, "llama"), root, "modelopt", per_channel=False,
                                        static=True)
    with caplog.at_level(logging.INFO, logger="runtime.native.models.fp8_checkpoint"):
        load_model(str(quantized))
    lines = [r.getMessage() for r in caplog.records if r.name == "runtime.native.models.fp8_checkpoint"]
    assert lines == ["FP8 checkpoint: no FP8 tensor cores on this device (CUDA compute capability 8.9+), "
                     "14 FP8 tensors dequantized to torch.float32 at load"]  # 2 layers x 7 projections


def test_quantization_fp8_holds_each_projections_per_channel_e4m3_values(root: Path) -> None:
    path = build_tiny_model(root, "llama-untied")
    ours, plain = load_model(str(path), quantization="fp8"), load_model(str(path))
    quantized = [name for name, _ in ours.named_parameters() if PROJECTION.search(name.replace("qkv_proj", "q_proj")
                                                                                 .replace("gate_up_proj", "up_proj"))]
    assert len(quantized) == 2 * 4  # qkv, o, gate_up, down in 2 layers
    for name, got in ours.named_parameters():
        want = plain.get_parameter(name)
        if name in quantized:
            values, scale = to_e4m3(want, per_channel=True)
            assert torch.equal(got, values.float() * scale), name
            assert not torch.equal(got, want), name
        else:  # embeddings, norms, the output head
            assert torch.equal(got, want), name


def test_a_quant_method_fp8_checkpoint_loads_as_its_dequantized_model(root: Path) -> None:
    """transformers' and AutoFP8's `quant_method: "fp8"` (no block size): the same tensors, another declaration."""
    quantized, plain = write_fp8_checkpoint(build_tiny_model(root, "llama"), root, "compressed-tensors",
                                            per_channel=False, static=True)
    folder = root / "autofp8"
    shutil.copytree(quantized, folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "static"}
    (folder / "config.json").write_text(json.dumps(config))
    ours, reference = load_model(str(folder)), load_model(str(plain))
    for (name, got), (_, want) in zip(ours.named_parameters(), reference.named_parameters(), strict=True):
        assert torch.equal(got, want), name
    config["quantization_config"]["weight_block_size"] = [128, 128]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match="block-wise FP8 weight scales"):
        load_model(str(folder))


@pytest.mark.parametrize(("edit", "message"), [
    ({"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}},
     "only 8-bit float weights are supported"),
    ({"weights": {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}},
     "FP8 weight scales by 'block' are not supported"),
])
def test_compressed_tensors_schemes_we_do_not_read_are_refused_by_name(root: Path, edit: dict, message: str) -> None:
    quantized, _ = write_fp8_checkpoint(build_tiny_model(root, "llama"), root, "compressed-tensors")
    folder = root / f"refused-{len(list(root.iterdir()))}"
    shutil.copytree(quantized, folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"].update(edit)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match=message):
        load_model(str(folder))


def test_modelopt_algorithms_we_do_not_read_are_refused_by_name(root: Path) -> None:
    quantized, _ = write_fp8_checkpoint(build_tiny_model(root, "llama"), root, "modelopt", per_channel=False,
                                        static=True)
    folder = root / "nvfp4"
    shutil.copytree(quantized, folder)
    (folder / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4"}}))
    with pytest.raises(UnsupportedArchitectureError, match="ModelOpt quant_algo 'NVFP4' is not supported"):
        load_model(str(folder))


def test_fp8_weights_without_their_scales_are_an_error(root: Path) -> None:
    from safetensors.torch import load_file, save_file

    quantized, _ = write_fp8_checkpoint(build_tiny_model(root, "llama"), root, "compressed-tensors")
    folder = root / "no-scale"
    shutil.copytree(quantized, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["model.layers.1.mlp.down_proj.weight_scale"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="FP8 weights without their scales in the checkpoint: "
                                         "model.layers.1.mlp.down_proj"):
        load_model(str(folder))
