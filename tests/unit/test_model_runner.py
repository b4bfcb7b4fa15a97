"""ModelRunner: packed mixed steps (prefill, prompt chunks, decodes) give transformers' logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime.model_runner import ModelRunner, StepInput
from runtime.models import load_model
from runtime.request import SamplingOptions
from runtime.sampler import Sampler, SamplingRow
from tests.tiny_models import build_tiny_model

BS = 4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("runner"), "llama")


@pytest.fixture(scope="module")
def hf_model(checkpoint: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()


@pytest.fixture()
def runner(checkpoint: Path) -> ModelRunner:
    r = ModelRunner(load_model(str(checkpoint), torch.float32, torch.device("cpu")), BS, Sampler(0))
    r.allocate_kv_cache(32)
    return r


def hf_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def greedy_row(prompt: list[int]) -> SamplingRow:
    return SamplingRow(SamplingOptions(temperature=0.0, logprobs=2), prompt, [], None, [0])


def test_prepare_builds_exact_metadata(runner: ModelRunner) -> None:
    inputs = [StepInput([5, 6, 7], 0, [3]), StepInput([9], 5, [1, 2])]
    ids, positions, meta = runner.prepare(inputs)
    assert ids.tolist() == [5, 6, 7, 9] and positions.tolist() == [0, 1, 2, 5]
    assert meta.query_start_loc.tolist() == [0, 3, 4]
    assert meta.context_lens.tolist() == [0, 5] and meta.seq_lens.tolist() == [3, 6]
    assert meta.block_tables.tolist() == [[3, 0], [1, 2]]
    assert meta.slot_mapping.tolist() == [12, 13, 14, 2 * BS + 1]
    assert (meta.max_query_len, meta.max_seq_len, meta.query_lens_host, meta.seq_lens_host) == (3, 6, [3, 1], [3, 6])


def test_mixed_prefill_chunk_and_decode_steps_match_transformers(runner: ModelRunner, hf_model: torch.nn.Module) -> None:
    a = [11, 42, 7, 99, 100, 3, 250]  # 7 tokens: blocks 0, 1
    b = list(range(20, 32))  # 12 tokens in chunks of 5 and 7: blocks 2, 3, 4
    table_a, table_b = [0, 1, 5], [2, 3, 4]
    ref_a, ref_b = hf_logits(hf_model, a), hf_logits(hf_model, b)

    # step 1: A's whole prompt (sampled) and B's first chunk (not sampled yet, all logits asked)
    res = runner.execute([
        StepInput(a, 0, table_a, [greedy_row(a)], return_sample_logits=True),
        StepInput(b[:5], 0, table_b, return_all_logits=True),
    ])
    tok_a = int(ref_a[-1].argmax())
    assert res[0].token_ids == [tok_a]
    torch.testing.assert_close(res[0].sample_logits[0], ref_a[-1], rtol=1e-4, atol=1e-4)
    assert res[0].logprobs[0] == pytest.approx(float(torch.log_softmax(ref_a[-1], -1)[tok_a]), abs=1e-4)
    assert [t for t, _ in res[0].top[0]] == ref_a[-1].topk(2).indices.tolist()
    assert res[1].token_ids == [] and res[1].all_logits is not None
    torch.testing.assert_close(res[1].all_logits, ref_b[:5], rtol=1e-4, atol=1e-4)

    # step 2: A decodes its token; B's last chunk attends to its cached first chunk and samples
    res = runner.execute([
        StepInput([tok_a], 7, table_a, [greedy_row(a)], return_sample_logits=True),
        StepInput(b[5:], 5, table_b, [greedy_row(b)], return_all_logits=True),
    ])
    ref_a2 = hf_logits(hf_model, a + [tok_a])
    torch.testing.assert_close(res[0].sample_logits[0], ref_a2[-1], rtol=1e-4, atol=1e-4)
    assert res[0].token_ids == [int(ref_a2[-1].argmax())]
    torch.testing.assert_close(res[1].all_logits, ref_b[5:], rtol=1e-4, atol=1e-4)
    assert res[1].token_ids == [int(ref_b[-1].argmax())]


def test_several_sample_rows_share_one_logits_row(runner: ModelRunner) -> None:
    prompt = [1, 2, 3, 4, 5]
    rows = [greedy_row(prompt) for _ in range(3)]
    res = runner.execute([StepInput(prompt, 0, [0, 1], rows)])
    assert len(res[0].token_ids) == 3 and len(set(res[0].token_ids)) == 1


def test_copy_blocks_copies_every_layer(runner: ModelRunner) -> None:
    for cache in runner.kv_caches:
        cache[:, 4].normal_()
    runner.copy_blocks([(4, 9)])
    for cache in runner.kv_caches:
        assert torch.equal(cache[:, 9], cache[:, 4]) and cache[:, 9].abs().sum() > 0


def test_copy_on_write_fork_continues_like_a_private_copy(runner: ModelRunner, hf_model: torch.nn.Module) -> None:
    prompt = [7, 8, 9, 10, 11, 12]  # block 0 full, block 1 half full
    res = runner.execute([StepInput(prompt, 0, [0, 1], [greedy_row(prompt)])])
    tok = res[0].token_ids[0]
    # a forked sample copies the shared partial block 1 into block 6, then both write position 6
    res = runner.execute(
        [StepInput([tok], 6, [0, 1], [greedy_row(prompt)]), StepInput([tok], 6, [0, 6], [greedy_row(prompt)])],
        copies=[(1, 6)],
    )
    expected = int(hf_logits(hf_model, prompt + [tok])[-1].argmax())
    assert res[0].token_ids == res[1].token_ids == [expected]
