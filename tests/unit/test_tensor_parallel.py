"""--tensor-parallel-size through the engine (NativeEngine, rank 0 in this process, a worker process per other rank,
gloo on the CPU, float32): greedy ids of every family we serve equal transformers' `generate` (which the same
engine at size 1 equals: test_model_families.py), in batches whose requests join at different steps with chunked
prefill; with LoRA adapters, transformers + PEFT's; seeded sampling with forks equals size 1's; the shares each rank
holds."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import torch

from runtime.architectures import UnsupportedArchitectureError
from runtime.native.models.linear import Linear, Shard
from runtime.native.parallel import group as tp_group
from runtime.native.parallel import workers
from runtime.native.parallel.group import TensorParallel
from runtime.process import launcher
from tests.engine_harness import collect, hf_greedy, load_hf, request, running_engine
from tests.lora_adapters import make_peft_adapter, peft_greedy
from tests.tiny_models import FAMILIES, SLIDING_WINDOW, build_tiny_model
from tests.unit.test_model_families import prompts

pytestmark = pytest.mark.long_file  # (tests/conftest.py schedules it first)

ARCHS = ("llama", "llama-untied", "qwen2", *FAMILIES)
SERVE = {"phi3": {"max_model_len": 64}}  # (as test_model_families.py: LongRoPE's short factors)
DEVICE = os.environ.get("ENGINE_TEST_DEVICE", "cpu")  # (running_engine reads it too)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, torch.nn.Module]]:
    root = tmp_path_factory.mktemp("tp")
    return {arch: (path, load_hf(path)) for arch in ARCHS for path in [build_tiny_model(root, arch)]}


async def _joining(engine, ps: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
    """Each pair of requests joins once the pair before has tokens."""
    tasks = []
    for first in range(0, len(ps), 2):
        events = [asyncio.Event(), asyncio.Event()]
        for i, event in zip((first, first + 1), events):
            tasks.append(asyncio.create_task(collect(engine, request(f"r{i}", ps[i], max_tokens[i]), started=event,
                                                     after_tokens=2)))
        await asyncio.gather(*(event.wait() for event in events))
    return [(await task).tokens[0] for task in tasks]


@pytest.mark.parametrize("arch", ARCHS)
async def test_tp2_greedy_batches_match_transformers(models, arch: str) -> None:
    """Prompts shorter and longer than the sliding window, prefilled in chunks beside decodes (max_num_tokens 8);
    async scheduling on, so decode tokens come from rank 0's samples on the device (shared with the workers)."""
    path, hf = models[arch]
    ps = prompts([5, 2 * SLIDING_WINDOW + 3, 9, 13], seed=3)
    max_tokens = [16, 12, 14, 10]
    async with running_engine(path, tensor_parallel_size=2, max_num_tokens=8, async_scheduling=True,
                              **SERVE.get(arch, {})) as engine:
        assert engine.runner.peers is not None and engine.runner.peers.size == 2
        got = await _joining(engine, ps, max_tokens)
    for i, prompt in enumerate(ps):
        assert got[i] == hf_greedy(hf, prompt, max_tokens[i]), f"request {i}"


async def test_tp2_ngram_speculation_keeps_the_greedy_ids(models) -> None:
    """Verification steps score several tokens a sequence (every row's logits gathered from the ranks)."""
    path, hf = models["qwen3"]
    prompt = [7, 8, 9, 10, 7, 8, 9, 10, 7, 8]  # repeats, so that n-grams propose
    async with running_engine(path, tensor_parallel_size=2, speculative="ngram", num_draft_tokens=2) as engine:
        out = await collect(engine, request("r", prompt, 16))
        assert engine.stats().spec_draft_tokens > 0
    assert out.tokens[0] == hf_greedy(hf, prompt, 16)


@pytest.mark.skipif(DEVICE.startswith("cuda") and torch.cuda.device_count() < 4, reason="needs 4 GPUs")
async def test_tp4_with_kv_heads_replicated_matches_transformers(models) -> None:
    """4 ranks over 2 KV heads: each KV head is cached by the two ranks whose query heads read it."""
    path, hf = models["qwen3"]
    prompt = prompts([11], seed=4)[0]
    async with running_engine(path, tensor_parallel_size=4) as engine:
        assert engine.runner.kv_caches[0].shape[3] == 1  # [2, blocks, block_size, kv heads, head_dim]
        out = await collect(engine, request("r", prompt, 12))
    assert out.tokens[0] == hf_greedy(hf, prompt, 12)


async def test_tp2_seeded_samples_with_forks_equal_tp1(models, monkeypatch: pytest.MonkeyPatch) -> None:
    """n=3 samples of one prompt (forked blocks: copy-on-write copies on every rank), seeded: rank 0 samples from
    the gathered logits as a single rank does."""
    path, _ = models["llama"]
    prompt = prompts([6], seed=5)[0]
    outs, copies = [], []
    for size in (1, 2):
        async with running_engine(path, tensor_parallel_size=size) as engine:
            if size == 2:  # count the copy-on-write copies the workers are told
                peers = engine.runner.peers
                tell = peers.copy_blocks
                monkeypatch.setattr(peers, "copy_blocks", lambda c, tell=tell: (copies.append(c), tell(c))[1])
            out = await collect(engine, request("r", prompt, 10, temperature=0.8, n=3, seed=7))
            outs.append(out.tokens)
    assert outs[0] == outs[1] and len(outs[0]) == 3
    assert copies  # the forks' shared last block (6 prompt tokens in blocks of 4) was copied on every rank


@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
async def test_tp2_lora_adapters_equal_peft(models, arch: str, tmp_path: Path) -> None:
    """Adapters split like their base weights (B by output rows on q/k/v and gate/up, A by input columns on o and
    down), two of them and the base model in one batch; one slot, so the second adapter evicts the first on every
    rank; the first registered at run time."""
    path, hf = models[arch]
    mlp = ["gate_proj", "up_proj", "down_proj"] if arch == "llama" else []
    every = make_peft_adapter(path, tmp_path / "every", ["q_proj", "k_proj", "v_proj", "o_proj", *mlp], r=4, seed=11)
    attn = make_peft_adapter(path, tmp_path / "attn", ["q_proj", "o_proj"], r=2, seed=12)
    ps = prompts([7, 12, 5], seed=6)
    async with running_engine(path, tensor_parallel_size=2, lora_modules={"attn": str(attn)}, max_loras=1) as engine:
        await engine.load_lora_adapter("every", str(every))
        reqs = [request(f"r{i}", p, 10) for i, p in enumerate(ps)]
        reqs[0].adapter, reqs[1].adapter = "every", "attn"
        outs = await asyncio.gather(*(collect(engine, r) for r in reqs))
        assert engine.lora.stats()["lora_evictions"] >= 1
    assert outs[0].tokens[0] == peft_greedy(path, every, ps[0], 10) != hf_greedy(hf, ps[0], 10)
    assert outs[1].tokens[0] == peft_greedy(path, attn, ps[1], 10)
    assert outs[2].tokens[0] == hf_greedy(hf, ps[2], 10)


async def test_what_tp_does_not_serve_is_refused_at_start(models, tmp_path: Path) -> None:
    path, _ = models["llama"]
    with pytest.raises(ValueError, match="does not serve --speculative draft"):
        async with running_engine(path, tensor_parallel_size=2, speculative="draft", draft_model=str(path)):
            pass
    with pytest.raises(UnsupportedArchitectureError, match="not split by --tensor-parallel-size"):
        async with running_engine(build_tiny_model(tmp_path, "gpt2"), tensor_parallel_size=2):
            pass


async def test_a_worker_that_cannot_start_fails_the_start(models, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a group that waits for it without end."""
    path, _ = models["llama"]

    def launch_failing(name: str, entry: str, args: bytes) -> launcher.Child:
        return launcher.launch(name, "tests.unit.test_tensor_parallel:exit_at_once", args)

    monkeypatch.setattr(workers, "launch", launch_failing)
    with pytest.raises(RuntimeError, match="worker 1 exited with code 1 before joining"):
        async with running_engine(path, tensor_parallel_size=2):
            pass
    assert tp_group.current().size == 1


def exit_at_once(args: bytes) -> int:
    """A worker process's entry that exits at once, with 1."""
    return 1


def test_shares_of_heads_kv_heads_and_vocabulary() -> None:
    assert [TensorParallel(r, 4).share(8, "heads") for r in range(4)] == [(0, 2), (2, 2), (4, 2), (6, 2)]
    assert [TensorParallel(r, 4).kv_heads(2) for r in range(4)] == [(0, 1), (0, 1), (1, 1), (1, 1)]
    assert [TensorParallel(r, 2).kv_heads(4) for r in range(2)] == [(0, 2), (2, 2)]
    assert [TensorParallel(r, 4).vocab_share(10) for r in range(4)] == [(0, 3, 3), (3, 3, 3), (6, 3, 3), (9, 1, 3)]
    with pytest.raises(ValueError, match="do not divide"):
        TensorParallel(0, 3).share(8, "attention heads")
    with pytest.raises(ValueError, match="not a multiple"):
        TensorParallel(0, 3).kv_heads(2)


def test_linear_shards_take_their_rows_and_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Column-parallel parts (given apart or fused in the checkpoint, a short last slice zero-padded) and
    row-parallel columns with the bias on the first rank only."""
    monkeypatch.setattr(tp_group, "_current", TensorParallel(1, 2))
    full = torch.arange(6 * 3, dtype=torch.float32).view(6, 3)  # parts a (4 rows) and b (2 rows)
    column = Linear(3, [("a", 2), ("b", 1)], shard=Shard(rows=((2, 2), (1, 1)), full_rows=(4, 2)))
    column.load("weight", full, None)
    assert column.weight.tolist() == full[[2, 3, 5]].tolist()
    column.load("weight", full[:4], "a")
    assert column.weight[:2].tolist() == full[2:4].tolist()
    padded = Linear(3, [("lm_head", 3)], shard=Shard(rows=((3, 2),), full_rows=(5,)))
    padded.load("weight", full[:5], "lm_head")
    assert padded.weight.tolist() == [*full[3:5].tolist(), [0.0, 0.0, 0.0]]
    row = Linear(2, [("o", 6)], bias=True, shard=Shard(cols=(1, 2), full_cols=3))
    row.load("weight", full, None)
    row.load("bias", torch.ones(6), None)
    assert row.weight.tolist() == full[:, 1:].tolist() and row.bias.tolist() == [0.0] * 6


def test_a_rank_reads_only_its_share_of_a_stored_weight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through safetensors' slices (LazyTensor): the rows of each fused part, and the columns of a row-parallel
    weight, as from the whole tensor."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from runtime.native.models.loader import LazyTensor

    monkeypatch.setattr(tp_group, "_current", TensorParallel(1, 2))
    full = torch.randn(6, 3)  # parts a (4 rows) and b (2 rows), fused as Phi-3 stores q/k/v
    save_file({"w": full}, str(tmp_path / "w.safetensors"))
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as f:
        column = Linear(3, [("a", 2), ("b", 1)], shard=Shard(rows=((2, 2), (1, 1)), full_rows=(4, 2)))
        column.load("weight", LazyTensor(f.get_slice("w")), None)
        row = Linear(2, [("o", 6)], shard=Shard(cols=(1, 2), full_cols=3))
        row.load("weight", LazyTensor(f.get_slice("w")), None)
    assert torch.equal(column.weight, full[[2, 3, 5]]) and torch.equal(row.weight, full[:, 1:])
