"""Beam search on NativeEngine equals transformers' `generate(num_beams=W, do_sample=False)`: the same W
sequences in the same order, finish reasons, length-penalised scores; also inside a busy batch under KV
pressure (beams paused and resumed), with blocks returned, and with the options it rejects named."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
import torch

from runtime.errors import InvalidRequestError, UnsupportedOptionError
from tests.engine_harness import Collected, StepRecorder, collect, hf_greedy, load_hf, request, running_engine
from tests.tiny_models import build_tiny_model

ARCHS = ("llama", "qwen2", "gpt2")
PROMPT = [random.Random(1).randrange(3, 300) for _ in range(9)]
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, torch.nn.Module]]:
    root = tmp_path_factory.mktemp("beams")
    return {arch: (path, load_hf(path)) for arch in ARCHS for path in [build_tiny_model(root, arch)]}


def hf_beams(model: torch.nn.Module, prompt: list[int], width: int, max_tokens: int, length_penalty: float = 1.0,
             eos: list[int] | None = None) -> tuple[list[list[int]], list[float]]:
    """transformers' W best beams (generated ids, without padding) and their length-penalised scores."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, num_beams=width,
                             num_return_sequences=width, do_sample=False, length_penalty=length_penalty,
                             eos_token_id=eos, return_dict_in_generate=True, output_scores=True)
    lengths = (out.beam_indices != -1).sum(dim=1).tolist()
    seqs = [out.sequences[i, len(prompt) : len(prompt) + lengths[i]].tolist() for i in range(width)]
    return seqs, out.sequences_scores.tolist()


def stop_token_where_length_penalty_matters(model: torch.nn.Module) -> int:
    """A token that ends some beams early enough that length_penalty 0 and 2 pick different beams."""
    plain, _ = hf_beams(model, PROMPT, 3, MAX_TOKENS)
    for token in sorted({t for s in plain for t in s[1:6]}):
        if hf_beams(model, PROMPT, 3, MAX_TOKENS, 0.0, [token])[0] != hf_beams(model, PROMPT, 3, MAX_TOKENS, 2.0, [token])[0]:
            return token
    raise AssertionError("no stop token makes the length penalty matter; the test would prove nothing")


def assert_same_beams(out: Collected, ref: tuple[list[list[int]], list[float]], length_penalty: float,
                      stop: set[int]) -> None:
    seqs, scores = ref
    assert [out.tokens[i] for i in range(len(seqs))] == seqs
    for i, s in enumerate(seqs):
        assert out.finish[i] == ("stop" if s[-1] in stop else "length")
        assert out.cumulative_logprob[i] / len(s) ** length_penalty == pytest.approx(scores[i], abs=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
async def test_beams_equal_transformers_beam_search_with_length_penalty(models, arch: str) -> None:
    path, hf = models[arch]
    stop = stop_token_where_length_penalty_matters(hf)
    async with running_engine(path) as engine:
        for width, lp in ((3, 0.0), (3, 2.0), (4, 1.0), (2, -1.0)):
            out = await collect(engine, request(f"b{width}{lp}", PROMPT, MAX_TOKENS, beam_width=width,
                                                length_penalty=lp, stop_token_ids=[stop]))
            assert_same_beams(out, hf_beams(hf, PROMPT, width, MAX_TOKENS, lp, [stop]), lp, {stop})
            assert out.usage.completion_tokens == sum(map(len, out.tokens.values()))
            assert out.usage.prompt_tokens == len(PROMPT)
        await asyncio.sleep(0.05)
        assert engine.stats().kv_blocks_used == 0
        engine.block_manager.check_invariants([])


async def test_eos_counts_among_the_stop_tokens_like_transformers(models) -> None:
    path, hf = models["qwen2"]
    stop = stop_token_where_length_penalty_matters(hf)
    async with running_engine(path) as engine:
        eos = engine.eos_token_ids
        out = await collect(engine, request("e", PROMPT, MAX_TOKENS, beam_width=3, stop_token_ids=[stop],
                                            ignore_eos=False))
    # K = (1 + number of stop tokens) x W candidates per round, on both sides
    assert_same_beams(out, hf_beams(hf, PROMPT, 3, MAX_TOKENS, 1.0, [*eos, stop]), 1.0, {stop, *eos})


async def test_beam_outputs_text_logprobs_and_single_final_deltas(models) -> None:
    path, hf = models["llama"]
    stop = stop_token_where_length_penalty_matters(hf)
    async with running_engine(path) as engine:
        rec = StepRecorder(engine)
        out = await collect(engine, request("t", PROMPT, MAX_TOKENS, beam_width=3, stop_token_ids=[stop],
                                            logprobs=2, length_penalty=0.0))
        tok = engine.tokenizer
    assert [d.index for d in out.deltas] == [0, 1, 2]  # nothing streams before the search is over
    assert out.deltas[0].prompt_token_ids == PROMPT and out.deltas[-1].usage is not None
    for d in out.deltas:
        shown = d.token_ids[:-1] if d.finish_reason == "stop" else d.token_ids
        assert d.text == tok.decode(shown)
        assert d.stop_reason == (stop if d.finish_reason == "stop" else None)
        assert [lp.token_id for lp in d.logprobs] == d.token_ids
        assert sum(lp.logprob for lp in d.logprobs) == pytest.approx(d.cumulative_logprob, abs=1e-5)
        assert all(len(lp.top) == 2 and lp.top[0][1] >= lp.logprob - 1e-6 for lp in d.logprobs)
    # the prompt was prefilled once; the beams share its blocks
    assert rec.prefill_tokens("t") == len(PROMPT)
    second = rec.steps[1]
    assert len(second) == 3 and second[0].block_table[:2] == second[1].block_table[:2] == second[2].block_table[:2]


@pytest.mark.parametrize(("policy", "kv_tokens"), [("max_utilization", 80), ("guaranteed_no_evict", 128)])
async def test_beams_in_a_busy_batch_under_kv_pressure(models, policy: str, kv_tokens: int) -> None:
    path, hf = models["gpt2"]
    others = [[random.Random(s).randrange(3, 300) for _ in range(6 + s)] for s in range(3)]
    # 20 or 32 blocks of 4 tokens (the beams' worst case is 28, everything's 52); a batch of 3 sequences
    # < 4 beams: beams wait for their siblings' logits across steps
    async with running_engine(path, max_model_len=64, max_kv_tokens=kv_tokens, max_batch_size=3,
                              scheduler_policy=policy) as engine:
        rec = StepRecorder(engine)
        tasks = [asyncio.create_task(collect(engine, request(f"g{i}", p, 24))) for i, p in enumerate(others)]
        beams = await collect(engine, request("beams", PROMPT, 16, beam_width=4))
        greedy = await asyncio.gather(*tasks)
        await asyncio.sleep(0.05)
        stats = engine.stats()
    assert [beams.tokens[i] for i in range(4)] == hf_beams(hf, PROMPT, 4, 16)[0]
    for out, p in zip(greedy, others):
        assert out.tokens[0] == hf_greedy(hf, p, 24)
    assert any(0 < sum(e.request_id == "beams" for e in step) < 4 for step in rec.steps[3:])  # split rounds
    assert stats.kv_blocks_used == 0 and max(rec.used_blocks) <= kv_tokens // 4
    if policy == "max_utilization":
        assert stats.preemptions > 0
    else:
        assert stats.preemptions == 0


async def test_abort_during_beam_search_frees_every_beam(models) -> None:
    path, _ = models["llama"]
    async with running_engine(path) as engine:
        task = asyncio.create_task(collect(engine, request("ab", PROMPT, 200, beam_width=4)))
        for _ in range(1000):
            await asyncio.sleep(0.002)
            if engine.stats().iterations >= 4:
                break
        engine.abort("ab")
        out = await task
        await asyncio.sleep(0.05)
        assert out.finish == {0: "abort"} and out.usage.completion_tokens == 0
        assert engine.stats().kv_blocks_used == 0
        engine.block_manager.check_invariants([])


async def test_options_beam_search_cannot_honour_are_named(models) -> None:
    path, _ = models["llama"]
    async with running_engine(path, max_beam_width=4) as engine:
        cases = [
            (dict(beam_width=5), InvalidRequestError, "beam_width"),
            (dict(beam_width=2, n=2), InvalidRequestError, "n"),
            (dict(beam_width=2, stop=["x"]), UnsupportedOptionError, "stop"),
            (dict(beam_width=2, repetition_penalty=1.2), UnsupportedOptionError, "repetition_penalty"),
            (dict(beam_width=2, return_generation_logits=True), UnsupportedOptionError, "return_generation_logits"),
            (dict(beam_width=2, length_penalty=float("nan")), InvalidRequestError, "length_penalty"),
        ]
        for kwargs, error, param in cases:
            with pytest.raises(error) as err:
                await engine.generate(request("x", PROMPT, 4, **kwargs)).__anext__()
            assert err.value.param == param and param in err.value.message


async def test_a_huge_length_penalty_ranks_beams_without_failing(models) -> None:
    """generated_len ** length_penalty overflowed a float: the request failed with an engine error."""
    path, _ = models["llama"]
    async with running_engine(path, max_beam_width=4) as engine:
        out = await collect(engine, request("huge", PROMPT, 4, beam_width=2, length_penalty=1e6))
    assert sorted(out.finish.values()) == ["length", "length"] and all(len(t) == 4 for t in out.tokens.values())
