"""benchmarks.gpu_models.widen_checkpoint: the demo target widened (hidden x2, heads x2, two MLP copies plus
spare units, two identity layers appended) computes the demo's function: same prompt logits and greedy
tokens in transformers, same greedy ids through our engine, same tokenizer and generation settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.gpu_models import widen_checkpoint
from tests.engine_harness import collect, request, running_engine

DEMO = Path(__file__).resolve().parents[2] / "runtime" / "demo" / "model"
# 704 source MLP units -> 2 copies (1408) + 128 spare; 6 source layers + 2 identity layers
SMALL = dict(hidden_size=512, num_hidden_layers=8, intermediate_size=1536, num_attention_heads=16,
             num_key_value_heads=4)
PROMPTS = ["def fibonacci(n):\n", "import os\nimport sys\n\n\ndef main():\n",
           "class Stack:\n    def __init__(self):\n"]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def widened(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return widen_checkpoint(DEMO, tmp_path_factory.mktemp("widen") / "model", dtype=torch.float32, **SMALL)


@pytest.fixture(scope="module")
def prompt_ids() -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(DEMO)
    return [tok(p)["input_ids"] for p in PROMPTS]


def hf(folder: Path) -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def test_config_keeps_vocabulary_heads_rope_and_tokenizer(widened: Path) -> None:
    src, got = (json.loads((d / "config.json").read_text()) for d in (DEMO, widened))
    assert {k: got[k] for k in SMALL} == SMALL
    for key in ("vocab_size", "head_dim", "rope_parameters", "bos_token_id", "eos_token_id",
                "max_position_embeddings", "tie_word_embeddings"):
        assert got[key] == src[key], key
    assert got["rms_norm_eps"] == pytest.approx(src["rms_norm_eps"] / 4)  # residual scaled by 1/2
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        assert (widened / name).read_bytes() == (DEMO / name).read_bytes()


@torch.inference_mode()
def test_transformers_logits_and_greedy_tokens_equal_the_source(widened: Path, prompt_ids: list[list[int]]) -> None:
    src, wide = hf(DEMO), hf(widened)
    assert wide.config.hidden_size == 2 * src.config.hidden_size
    ids = torch.tensor([sum(prompt_ids, [])])
    ref, got = src(ids).logits, wide(ids).logits
    assert ((got - ref).norm() / ref.norm()).item() < 1e-4
    # the three prompts in one left-padded batch (one generate call per model keeps the test fast)
    width = max(map(len, prompt_ids))
    x = torch.tensor([[0] * (width - len(p)) + p for p in prompt_ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids])
    kwargs = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    expected = src.generate(x, **kwargs)[:, width:]
    assert expected.shape == (len(PROMPTS), NEW_TOKENS)
    assert wide.generate(x, **kwargs)[:, width:].tolist() == expected.tolist()


async def test_engine_greedy_ids_equal_the_source(widened: Path, prompt_ids: list[list[int]]) -> None:
    outs: dict[Path, list[list[int]]] = {}
    for folder in (DEMO, widened):
        async with running_engine(folder, max_model_len=256) as engine:
            outs[folder] = [(await collect(engine, request(f"r{i}", p, NEW_TOKENS))).tokens[0]
                            for i, p in enumerate(prompt_ids)]
    assert all(len(o) == NEW_TOKENS for o in outs[DEMO])
    assert outs[widened] == outs[DEMO]


def test_shapes_that_are_not_one_multiple_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="same integer multiple"):  # heads x2 but KV heads x4
        widen_checkpoint(DEMO, tmp_path / "bad", hidden_size=512, num_attention_heads=16, num_key_value_heads=8)
    with pytest.raises(ValueError, match="num_hidden_layers"):
        widen_checkpoint(DEMO, tmp_path / "bad", hidden_size=512, num_hidden_layers=4, intermediate_size=1536,
                         num_attention_heads=16, num_key_value_heads=4)
    assert not (tmp_path / "bad").exists()
