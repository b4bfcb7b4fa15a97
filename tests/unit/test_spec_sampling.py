"""Speculative sampling keeps the target's distribution: on a tiny model (300-token vocabulary), the
tokens drawn at the speculated positions follow the same distribution with and without speculation
(chi-square over 600 seeded samples each; seeds are fixed, so the test is deterministic)."""

from __future__ import annotations

import asyncio
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from scipy.stats import chi2_contingency

from tests.engine_harness import collect, request, running_engine
from tests.tiny_models import build_tiny_model

PROMPT = list(range(3, 200, 2))  # many distinct tokens: n-gram lookups often find the last one
REQUESTS, N, MAX_TOKENS = 12, 50, 4


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("spec-sampling")
    target = build_tiny_model(root, "llama")
    return target, perturbed_copy(target, root / "draft", noise=0.05)


def perturbed_copy(checkpoint: Path, folder: Path, noise: float) -> Path:
    """The checkpoint with noise on every weight: a draft that agrees with the target often, not always."""
    shutil.copytree(checkpoint, folder)
    weights = load_file(folder / "model.safetensors")
    gen = torch.Generator().manual_seed(7)
    save_file({k: v + noise * v.std() * torch.randn(v.shape, generator=gen) if v.dim() > 1 else v
               for k, v in weights.items()}, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


async def samples(checkpoint: Path, temperature: float, **config) -> list[list[int]]:
    async with running_engine(checkpoint, max_batch_size=64, max_kv_tokens=4096, **config) as engine:
        reqs = [request(f"r{i}", PROMPT, MAX_TOKENS, temperature=temperature, n=N, seed=100 + i)
                for i in range(REQUESTS)]
        outs = await asyncio.gather(*(collect(engine, r) for r in reqs))
        stats = engine.stats()
    if config:
        assert stats.spec_steps > 0 and 0 < stats.spec_accepted_tokens < stats.spec_draft_tokens
        print(f"{config['speculative']}: acceptance {stats.spec_accepted_tokens / stats.spec_draft_tokens:.2f}")
    return [o.tokens[i] for o in outs for i in range(N)]


def same_distribution(a: list[int], b: list[int]) -> float:
    """p-value of a two-sample chi-square test; rare tokens (< 10 in both) are pooled into one bin."""
    ca, cb = Counter(a), Counter(b)
    common = [t for t in set(ca) | set(cb) if ca[t] + cb[t] >= 10]
    rows = [[ca[t] for t in common], [cb[t] for t in common]]
    rows[0].append(len(a) - sum(rows[0]))
    rows[1].append(len(b) - sum(rows[1]))
    table = np.array(rows)
    table = table[:, table.sum(axis=0) > 0]
    assert table.shape[1] >= 3, "the test needs a spread-out distribution"
    return float(chi2_contingency(table).pvalue)


@pytest.mark.parametrize("mode", ["draft", "ngram"])
async def test_speculated_tokens_follow_the_targets_distribution(pair, mode: str) -> None:
    target, draft = pair
    plain = await samples(target, 1.0)
    config = {"speculative": "draft", "draft_model": str(draft)} if mode == "draft" else {
        "speculative": "ngram", "ngram_min": 1}
    spec = await samples(target, 1.0, num_draft_tokens=3, **config)
    assert all(len(s) == MAX_TOKENS for s in plain + spec)
    for pos in range(1, MAX_TOKENS):  # position 0 comes from the prefill, speculation starts at 1
        p = same_distribution([s[pos] for s in plain], [s[pos] for s in spec])
        assert p > 0.001, f"position {pos}: distributions differ (p={p:.2g})"
