"""GGUF files of Qwen3, Qwen3-MoE, Gemma 3 and Phi-3 (runtime/native/models/gguf.py): tiny random checkpoints of each
(tests/tiny_models.py) are written the way llama.cpp's convert_hf_to_gguf.py writes them (tensor names from the
`gguf` package's own map, experts stacked per layer, Gemma's norms plus one, Phi-3's fused projections and its
LongRoPE factors as tensors), converted back by resolve_gguf, and must load to the same weights and logits as the
original checkpoint."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import MODEL_ARCH, GGMLQuantizationType, GGUFWriter, get_tensor_name_map
from gguf.quants import quantize
from safetensors.torch import load_file

from runtime.model_spec import ModelSpec
from runtime.native.models import load_model
from runtime.native.models.gguf import resolve_gguf
from tests.engine_harness import collect, request, running_engine
from tests.tiny_models import build_tiny_model
from tests.unit.test_gguf import _add_tokenizer
from tests.unit.test_models import PROMPT, PagedRunner

# our tiny family -> (llama.cpp's architecture, config overrides for what GGUF cannot say: Gemma 3's 5:1 layer
# pattern is llama.cpp's fixed one, as is Qwen3-MoE's "every layer has experts"; Gemma 3 has no softcapping there)
FAMILIES = {
    "qwen3": ("qwen3", {}),
    "qwen3_moe": ("qwen3moe", {"mlp_only_layers": []}),
    "gemma3": ("gemma3", {"num_hidden_layers": 6, "layer_types": None, "final_logit_softcapping": None}),
    "phi3": ("phi3", {}),
}
_ARCH = {"qwen3": MODEL_ARCH.QWEN3, "qwen3moe": MODEL_ARCH.QWEN3MOE, "gemma3": MODEL_ARCH.GEMMA3,
         "phi3": MODEL_ARCH.PHI3}


@pytest.fixture(autouse=True)
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _add(writer: GGUFWriter, name: str, data: np.ndarray, qtype: str) -> None:
    if data.ndim == 1 or qtype == "F32":
        writer.add_tensor(name, data.astype(np.float32))
    else:
        kind = GGMLQuantizationType[qtype]
        writer.add_tensor(name, quantize(data, kind), raw_dtype=kind)


def write_family_gguf(hf_folder: Path, out: Path, arch: str, qtype: str = "F32") -> Path:
    """`hf_folder` as llama.cpp's converter writes GGUF architecture `arch`."""
    config = json.loads((hf_folder / "config.json").read_text())
    weights = {k: v.float().numpy() for k, v in load_file(hf_folder / "model.safetensors").items()}
    layers = config["num_hidden_layers"]
    num_experts = config.get("num_experts") or config.get("num_local_experts")  # (saved as the latter)
    names = get_tensor_name_map(_ARCH[arch], layers)
    writer = GGUFWriter(out, arch)
    writer.add_name("tiny")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(layers)
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    rope = config["rope_parameters"]
    rope = rope.get("full_attention", rope)
    writer.add_rope_freq_base(rope["rope_theta"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if arch != "phi3":
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
    if arch == "qwen3moe":
        writer.add_expert_count(num_experts)
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    if arch == "gemma3":
        writer.add_sliding_window(config["sliding_window"])
    if arch == "phi3":  # LongRoPE: the factors as tensors, the original window and attention factor as metadata
        original = rope["original_max_position_embeddings"]
        writer.add_rope_scaling_orig_ctx_len(original)
        scale = config["max_position_embeddings"] / original
        writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)))
        writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
        writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
    _add_tokenizer(writer, json.loads((hf_folder / "tokenizer.json").read_text()), config)

    experts: dict[str, list[np.ndarray]] = {}
    for hf_name, data in weights.items():
        if hf_name == "lm_head.weight" and config["tie_word_embeddings"]:
            continue
        base, _, suffix = hf_name.rpartition(".")
        if ".mlp.experts." in base:  # model.layers.L.mlp.experts.E.gate_proj: stacked per layer, as llama.cpp does
            prefix, _, rest = base.partition(".mlp.experts.")
            kind = rest.split(".", 1)[1]
            experts.setdefault(f"{prefix}.mlp.experts.{kind}", [None] * num_experts)[int(rest.split(".")[0])] = data
            continue
        if arch == "gemma3" and "norm" in base:
            data = data + 1  # llama.cpp stores the (1 + weight) Gemma scales by
        _add(writer, f"{names.get_name(base)}.{suffix}", data, qtype)
    for base, stacked in experts.items():
        _add(writer, f"{names.get_name(base)}.weight", np.stack(stacked), qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_gguf_loads_to_the_same_weights_and_logits(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path,
                                                  family: str) -> None:
    gguf_arch, overrides = FAMILIES[family]
    original = build_tiny_model(tmp_path_factory.mktemp("gguf-families"), family, **overrides)
    folder = resolve_gguf(str(write_family_gguf(original, tmp_path / f"{family}.gguf", gguf_arch)))
    ours, reference = ModelSpec.from_pretrained(folder), ModelSpec.from_pretrained(original)
    assert ours.architecture == reference.architecture
    assert (ours.layer_windows, ours.head_dim, ours.moe) == (reference.layer_windows, reference.head_dim, reference.moe)
    converted, expected = load_model(folder, torch.float32), load_model(str(original), torch.float32)
    for (name, got), (_, want) in zip(converted.named_parameters(), expected.named_parameters(), strict=True):
        assert torch.equal(got, want), name
    prompt = PROMPT + PROMPT  # past Gemma's window of 8
    torch.testing.assert_close(PagedRunner(converted).step([("a", prompt)])[0],
                               PagedRunner(expected).step([("a", prompt)])[0], atol=1e-4, rtol=1e-4)


async def test_quantized_qwen3_moe_gguf_serves(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    """A Q8_0 file (stacked experts quantized too) through the engine: the ids of the dequantized checkpoint."""
    original = build_tiny_model(tmp_path_factory.mktemp("gguf-q8"), "qwen3_moe", mlp_only_layers=[])
    path = write_family_gguf(original, tmp_path / "moe-q8.gguf", "qwen3moe", "Q8_0")
    dequantized = load_model(resolve_gguf(str(path)), torch.float32)
    runner = PagedRunner(dequantized)
    want = [int(runner.step([("a", PROMPT)])[0][-1].argmax())]
    for _ in range(7):
        want.append(int(runner.step([("a", want[-1:])])[0][-1].argmax()))
    async with running_engine(path) as engine:
        out = await collect(engine, request("q8", PROMPT, 8))
    assert out.tokens[0] == want
