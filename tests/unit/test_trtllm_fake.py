"""The fake tensorrt_llm behaves as the real code it names (each fake module's docstring gives file and commit):
SamplingParams' checks, _setup only without end_id, one response per sequence, the shared iteration-stats
result, prompt-logprob rows, _TrtLLM's argument checks, and which flow runs each speculative config.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.fakes.trtllm import engine_folder, fake_trtllm  # noqa: F401  (fixture)
from tests.tiny_models import build_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("trtllm_fake"), "llama")


def test_sampling_params_validate(fake_trtllm, monkeypatch):
    from tensorrt_llm import GuidedDecodingParams, SamplingParams

    for kwargs, message in (({"top_p": 1.5}, "0 <= top_p <= 1"), ({"top_k": -1}, "top_k >= 0"),
                            ({"temperature": -0.1}, "temperature >= 0"), ({"n": 3, "best_of": 2}, "less than n"),
                            ({"n": 2}, "Greedy decoding"), ({"n": 2, "temperature": 0.0}, "Greedy decoding"),
                            ({"n": 2, "temperature": 1.0, "top_k": 1}, "Greedy decoding"),
                            ({"n": 2, "temperature": 1.0, "top_p": 0.0}, "Greedy decoding"),
                            ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
                            ({"guided_decoding": GuidedDecodingParams(regex="a", grammar="b")}, "Only one guide")):
        with pytest.raises(ValueError, match=message):
            SamplingParams(**kwargs)
    sp = SamplingParams(n=2, temperature=0.7, logprobs=True, end_id=5)
    assert (sp.best_of, sp.logprobs, sp.pad_id) == (2, 1, 5)
    monkeypatch.setenv("TLLM_ALLOW_N_GREEDY_DECODING", "1")
    assert SamplingParams(n=2, temperature=0.0).best_of == 2


async def test_bad_words_are_tokenized_only_without_end_id(fake_trtllm, model_dir):
    from tensorrt_llm import LLM, SamplingParams
    from tensorrt_llm.executor import RequestError

    llm = LLM(model=str(model_dir), enable_iter_perf_stats=True)
    try:
        eos = llm.tokenizer.eos_token_id
        rejected = llm.generate_async([5, 6], SamplingParams(max_tokens=2, end_id=eos, bad="ab"), streaming=True)
        with pytest.raises(RequestError, match=r"SamplingParams.bad \(ab\) is not processed by tokenizer"):
            await rejected  # the worker's error reaches the consumer, not generate_async
        sp = SamplingParams(max_tokens=2, bad="ab", temperature=1.0)
        out = await llm.generate_async([5, 6], sp, streaming=True)
        assert sp.end_id == eos and sp._bad_word_ids == [llm.tokenizer.encode("ab", add_special_tokens=False)]
        assert out.outputs[0].finish_reason == "length"
    finally:
        llm.shutdown()


async def test_each_response_updates_one_sequence(fake_trtllm, model_dir):
    """n > 1: only outputs[sequence_index] moves; finish reasons (and the stop-word cut) only on the last
    response, for its sequence."""
    from tensorrt_llm import LLM, SamplingParams

    llm = LLM(model=str(model_dir))
    try:
        sp = dict(max_tokens=6, temperature=1.0, seed=11, n=2, ignore_eos=True)
        free = await llm.generate_async([7, 8], SamplingParams(**sp), streaming=True)
        stop = next(t for t in free.outputs[0].token_ids[1:-1] if t not in free.outputs[1].token_ids)
        result = llm.generate_async([7, 8], SamplingParams(**sp, stop_token_ids=[stop]), streaming=True)
        previous = [[], []]
        async for _ in result:
            moved = [out.token_ids_diff != prev for out, prev in zip(result.outputs, previous)]
            assert sum(moved) <= 1  # the other output still shows its last diff
            previous = [list(out.token_ids_diff) for out in result.outputs]
        first, second = result.outputs
        cut = free.outputs[0].token_ids.index(stop)
        assert first.token_ids == free.outputs[0].token_ids[: cut + 1] and first.finish_reason is None
        assert second.token_ids == free.outputs[1].token_ids and second.finish_reason == "length"
    finally:
        llm.shutdown()


async def test_iteration_stats_result_is_shared_and_stays_done(fake_trtllm, model_dir, capsys):
    from tensorrt_llm import LLM, SamplingParams

    llm = LLM(model=str(model_dir), enable_iter_perf_stats=True)
    try:
        assert [s async for s in llm.get_stats_async(timeout=0.1)] == []
        assert "Iteration statistics are not available yet" in capsys.readouterr().err
        await llm.generate_async([5, 6], SamplingParams(max_tokens=3, temperature=1.0), streaming=True)
        stats = llm.get_stats_async(timeout=0.1)
        assert stats is llm.get_stats_async(timeout=0.1)  # one shared result
        assert [s["iter"] async for s in stats] == [0, 1, 2]  # then a read timed out: done
        assert [s async for s in llm.get_stats_async(timeout=None)] == []  # stays done: ends at once
        await llm.generate_async([5, 6], SamplingParams(max_tokens=2, temperature=1.0), streaming=True)
        assert [s["iter"] async for s in llm.get_stats_async(timeout=0.1)] == [3, 4]  # a request: undone
    finally:
        llm.shutdown()


async def test_prompt_logprob_rows_describe_the_next_token(fake_trtllm, model_dir):
    """Row t: the top-k of log_softmax(context logits[t]), the distribution of token t + 1 (1.2: no token)."""
    from tensorrt_llm import LLM, SamplingParams

    llm = LLM(model=str(model_dir))
    try:
        prompt = [5, 6, 7, 8]
        out = await llm.generate_async(prompt, SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=2),
                                       streaming=True)
        rows = out.outputs[0].prompt_logprobs
        with torch.no_grad():
            ref = torch.log_softmax(llm._executor._engine.model(torch.tensor([prompt])).logits[0], dim=-1)
        assert len(rows) == len(prompt) and out.context_logits is None  # asked for rows only
        for t, row in enumerate(rows):
            values, ids = torch.topk(ref[t], 2)
            assert {i: lp.rank for i, lp in row.items()} == {int(i): r + 1 for r, i in enumerate(ids)}
            assert {i: lp.logprob for i, lp in row.items()} == pytest.approx(
                {int(i): float(v) for v, i in zip(values, ids)})
    finally:
        llm.shutdown()


def test_engine_llm_checks_logits_and_speculation(fake_trtllm, model_dir, tmp_path):
    from tensorrt_llm import LLM, SamplingParams
    from tensorrt_llm._tensorrt_engine import LLM as TrtLLM
    from tensorrt_llm.llmapi import DraftTargetDecodingConfig, MedusaDecodingConfig, NGramDecodingConfig

    engine = engine_folder(tmp_path, max_seq_len=64, max_batch_size=4)
    llm = TrtLLM(model=engine, tokenizer=str(model_dir))
    with pytest.raises(ValueError, match="requires `gather_generation_logits=True`"):
        llm.generate_async([5], SamplingParams(logprobs=1, temperature=1.0))
    with pytest.raises(ValueError, match="requires `gather_context_logits=True`"):
        llm.generate_async([5], SamplingParams(prompt_logprobs=1, temperature=1.0))
    with pytest.raises(ValueError, match="should not exceed max_seq_len"):
        llm.generate_async([5] * 60, SamplingParams(max_tokens=5, temperature=1.0))
    with pytest.raises(ValueError, match="cannot exceed max_batch_size"):
        llm.generate_async([5], SamplingParams(n=5, temperature=1.0))
    sp = SamplingParams(logprobs=1, temperature=1.0)
    TrtLLM(model=engine, tokenizer=str(model_dir), gather_generation_logits=True).generate_async([5], sp)
    assert sp.return_generation_logits and sp._generation_logits_auto_enabled
    draft = DraftTargetDecodingConfig(max_draft_len=2, speculative_model_dir=str(model_dir))
    assert draft.speculative_model == str(model_dir)  # the old name is still accepted
    with pytest.raises(ValueError, match="Speculation type Draft_Target does not support backend None"):
        TrtLLM(model=engine, tokenizer=str(model_dir), speculative_config=draft)
    with pytest.raises(ValueError, match="Speculation type Medusa does not support backend pytorch"):
        LLM(model=str(model_dir), speculative_config=MedusaDecodingConfig(max_draft_len=2))
    with pytest.raises(ValueError, match="max_draft_len must be > 0 for NGram"):
        NGramDecodingConfig(max_matching_ngram_size=2)
