"""PEFT folders the LoRA manager refuses, each with a message naming the problem, and rank/alpha rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from runtime.config import EngineConfig
from runtime.errors import InvalidRequestError
from runtime.native.lora import LoraManager
from runtime.peft_config import read_peft_config
from runtime.native.models import load_model
from tests.lora_adapters import make_peft_adapter
from tests.tiny_models import build_tiny_model


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("peft"), "llama")


@pytest.fixture(scope="module")
def manager(base: Path) -> LoraManager:
    return LoraManager(EngineConfig(max_lora_rank=8), load_model(str(base), torch.float32, torch.device("cpu")))


def test_adapters_on_modules_we_cannot_adapt_are_refused(base, manager, tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    path = make_peft_adapter(base, tmp_path / "odd", ["q_proj"])
    file = path / "adapter_model.safetensors"
    save_file({k.replace("q_proj", "q_norm"): v for k, v in load_file(str(file)).items()}, str(file))
    with pytest.raises(InvalidRequestError, match="targets 'model.layers.0.self_attn.q_norm', which is not an "
                                                  "adaptable projection of this model \\(adaptable: q_proj, "
                                                  "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj\\)"):
        manager.register("odd", str(path))
    # PEFT saves the (tied) embedding with an lm_head adapter: refused by the tensor's name
    head = make_peft_adapter(base, tmp_path / "head", ["lm_head"])
    with pytest.raises(InvalidRequestError, match="unsupported tensor 'base_model.model.lm_head.base_layer.weight'"):
        manager.register("head", str(head))
    assert manager.adapters() == {}


@pytest.mark.parametrize("change,message", [
    ({"use_dora": True}, "DoRA is not supported"),
    ({"bias": "all"}, "trained LoRA biases are not supported"),
    ({"peft_type": "IA3"}, "peft_type 'IA3' is not LORA"),
    ({"r": 16}, "rank 16 exceeds --max-lora-rank \\(8\\)"),
    ({"rank_pattern": {"q_proj": 32}}, "rank 32 exceeds --max-lora-rank \\(8\\)"),
])
def test_unsupported_configs_are_refused(base, manager, tmp_path, change, message) -> None:
    path = make_peft_adapter(base, tmp_path / "a", ["q_proj"], r=4)
    cfg = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(InvalidRequestError, match=message):
        manager.register("a", str(path))


def test_missing_files_are_named(manager, tmp_path) -> None:
    with pytest.raises(InvalidRequestError, match="is not a folder"):
        manager.register("x", str(tmp_path / "nowhere"))
    with pytest.raises(InvalidRequestError, match="no adapter_config.json"):
        manager.register("x", str(tmp_path))


def test_scaling_follows_peft() -> None:
    from runtime.peft_config import PeftConfig

    cfg = PeftConfig(r=4, lora_alpha=8, alpha_pattern={"up_proj": 3.0})
    assert cfg.scaling("model.layers.0.self_attn.q_proj", 4) == 2.0
    assert cfg.scaling("model.layers.0.mlp.up_proj", 4) == 0.75  # pattern matches the dotted suffix
    assert cfg.scaling("model.layers.0.mlp.not_up_proj", 4) == 2.0
    rs = PeftConfig(r=16, lora_alpha=8, use_rslora=True)
    assert rs.scaling("x.q_proj", 16) == 2.0  # alpha / sqrt(r)


def test_registered_adapter_weights_are_scaled_copies(base, tmp_path) -> None:
    path = make_peft_adapter(base, tmp_path / "s", ["v_proj"], r=2, alpha=6)
    m = LoraManager(EngineConfig(max_lora_rank=8), load_model(str(base), torch.float32, torch.device("cpu")))
    adapter = m.register("s", str(path))
    from safetensors.torch import load_file

    raw = load_file(str(path / "adapter_model.safetensors"))
    pair = adapter.weights.modules["model.layers.1.self_attn.qkv_proj"][0]
    b = raw["base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"]
    assert (pair.start, pair.size) == (64 + 32, 32)  # v rows of the fused qkv (q 64, k 32, v 32)
    torch.testing.assert_close(pair.b, b * 3.0)
    assert read_peft_config(path, 8).r == 2 and adapter.lora_id == 1
