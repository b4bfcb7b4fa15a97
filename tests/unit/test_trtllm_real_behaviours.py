"""TrtllmEngine against behaviours of the real TensorRT-LLM that the fake now follows (issue 49): per-sequence
streaming with n > 1, bad words only tokenized without end_id, prompt-logprob rows describing the next token,
the shared iteration-stats result, logprobs on engine folders, invalid requests, speculation per flow.
Each test failed on the backend before its fix, with this fake.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest
import torch

from runtime.errors import InvalidRequestError, UnsupportedOptionError
from runtime.request import GenerationRequest, SamplingOptions
from tests.engine_harness import hf_greedy, load_hf
from tests.fakes.trtllm import (collect, engine_folder, fake_trtllm, make_config, recording,  # noqa: F401
                                running)
from tests.tiny_models import bannable_token, build_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("trtllm_real"), "llama")


def by_index(deltas: list, field: str = "token_ids") -> dict[int, list]:
    out: dict[int, list] = {}
    for d in deltas:
        out.setdefault(d.index, []).extend(getattr(d, field) or [])
    return out


async def test_n2_streaming_delivers_each_token_once(fake_trtllm, model_dir):
    """Each response updates one sequence; the other keeps its old token_ids_diff, which must not repeat."""
    async with running(make_config(model_dir)) as engine:
        calls = recording(engine)
        options = SamplingOptions(max_tokens=6, temperature=0.8, seed=3, n=2, ignore_eos=True, logprobs=1)
        deltas = await collect(engine, GenerationRequest("n", prompt="hello world", sampling=options))
        final = calls[0]["result"].outputs
        tokens = by_index(deltas)
        assert tokens == {0: final[0].token_ids, 1: final[1].token_ids} and len(tokens[0]) == 6
        assert {i: [lp.token_id for lp in lps] for i, lps in by_index(deltas, "logprobs").items()} == tokens
        assert {d.index: d.finish_reason for d in deltas if d.finish_reason} == {0: "length", 1: "length"}
        assert deltas[-1].usage.completion_tokens == 12


async def test_a_sample_that_stops_before_the_last_response_ends_at_its_stop_token(fake_trtllm, model_dir):
    """TensorRT-LLM names finish reasons (and cuts stop tokens) only on the request's last response: a sample
    that stopped earlier shows neither, so its stop token id ends it here."""
    async with running(make_config(model_dir)) as engine:
        options = dict(max_tokens=8, temperature=1.0, seed=11, n=2, ignore_eos=True)
        free = by_index(await collect(engine, GenerationRequest("f", prompt="a b",
                                                                sampling=SamplingOptions(**options))))
        stops = [t for t in free[0][1:-1] if t not in free[1]]
        assert stops, f"no token of sample 0 is missing from sample 1: {free}"
        cut = free[0].index(stops[0])
        deltas = await collect(engine, GenerationRequest("s", prompt="a b", sampling=SamplingOptions(
            **options, stop_token_ids=[stops[0]])))
        assert by_index(deltas) == {0: free[0][:cut], 1: free[1]}
        ends = {d.index: (d.finish_reason, d.stop_reason) for d in deltas if d.finish_reason}
        assert ends == {0: ("stop", stops[0]), 1: ("length", None)}
        assert deltas[-1].usage.completion_tokens == cut + 8


async def test_bad_words_reach_the_runtime_tokenized(fake_trtllm, model_dir):
    """SamplingParams._setup tokenizes `bad` only when end_id is None; the worker refuses them otherwise."""
    async with running(make_config(model_dir)) as engine:
        greedy = dict(max_tokens=8, temperature=0.0, ignore_eos=True)
        free = [t for d in await collect(engine, GenerationRequest("f", prompt="x y", sampling=SamplingOptions(
            **greedy))) for t in d.token_ids]
        banned, word = bannable_token(engine.tokenizer, free)
        deltas = await collect(engine, GenerationRequest("b", prompt="x y", sampling=SamplingOptions(
            **greedy, bad_words=[word])))
        out = [t for d in deltas for t in d.token_ids]
        assert len(out) == 8 and banned not in out and out != free


async def test_prompt_logprobs_pair_each_row_with_the_token_it_describes(fake_trtllm, model_dir):
    """Row t of TensorRT-LLM's prompt logprobs follows prompt token t: it describes token t + 1 (1.2 keeps the
    top-k only, so a token outside it has none)."""
    hf = load_hf(model_dir)
    async with running(make_config(model_dir)) as engine:
        first = engine.tokenizer.encode("the")[:1]
        for prompt in (first + hf_greedy(hf, first, 5), engine.tokenizer.encode("The quick brown fox jumps")):
            deltas = await collect(engine, GenerationRequest("p", prompt_token_ids=prompt, sampling=SamplingOptions(
                max_tokens=1, prompt_logprobs=1, ignore_eos=True)))
            with torch.no_grad():
                ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), dim=-1)
            entries = deltas[0].prompt_logprobs
            assert len(entries) == len(prompt) and entries[0] is None
            for i in range(1, len(prompt)):
                best = int(ref[i - 1].argmax())
                if best == prompt[i]:  # within the top-1 row
                    assert entries[i].token_id == prompt[i] and entries[i].top[0][0] == best
                    assert entries[i].logprob == pytest.approx(float(ref[i - 1, prompt[i]]), abs=1e-4)
                else:
                    assert entries[i] is None
        assert None in entries[1:]  # a prompt the model would not write: some tokens are outside the top-1


async def test_iteration_stats_of_a_request_whose_first_iteration_is_slow(fake_trtllm, model_dir, capsys):
    """get_stats_async warns on every call before the first request, and its shared result, once a read
    times out, ends every later read until the next request: a 0.5 s poll lost all of a request whose first
    iteration (a long prefill) took longer than that."""
    async with running(make_config(model_dir)) as engine:
        await asyncio.sleep(1.2)  # idle, before any request
        assert "Iteration statistics are not available yet" not in "".join(capsys.readouterr())
        runtime = engine.llm._executor._engine
        step, slow = runtime.step, [1.2]

        def slow_first_step():
            time.sleep(slow.pop() if slow else 0)
            return step()

        runtime.step = slow_first_step
        await collect(engine, GenerationRequest("s", prompt="a long prefill", sampling=SamplingOptions(
            max_tokens=6, ignore_eos=True)))
        for _ in range(100):
            if engine.stats().iterations >= 6:
                break
            await asyncio.sleep(0.05)
        assert engine.stats().iterations == 6  # one iteration per token in the fake


async def test_invalid_requests_are_invalid_request_errors(fake_trtllm, model_dir, tmp_path):
    """SamplingParams and LoRARequest validate their arguments with ValueError: a 400, not a 500."""
    adapter = tmp_path / "gone"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}')
    async with running(make_config(model_dir, lora_modules={"gone": str(adapter)}, max_lora_rank=8)) as engine:
        with pytest.raises(InvalidRequestError, match="Greedy decoding in the LLM API does not allow multiple"):
            await collect(engine, GenerationRequest("g", prompt="hi", sampling=SamplingOptions(temperature=0.0, n=2)))
        shutil.rmtree(adapter)
        with pytest.raises(InvalidRequestError, match=r"lora_path \(.*gone\) does not exist"):
            await collect(engine, GenerationRequest("l", prompt="hi", adapter="gone"))
        assert not engine._results and not engine.llm._executor._results


async def test_logprobs_on_an_engine_folder(fake_trtllm, model_dir, tmp_path):
    """TensorRT-LLM refuses logprobs unless the LLM got gather_generation_logits=True, and prompt logprobs
    unless the engine was built with gather_context_logits (refused here, naming the option)."""
    async with running(make_config(engine_folder(tmp_path), tokenizer=str(model_dir))) as engine:
        calls = recording(engine)
        stream = engine.generate(GenerationRequest("l", prompt="hi", sampling=SamplingOptions(logprobs=1)))
        with pytest.raises(asyncio.TimeoutError):  # accepted: it waits, as a TensorRT engine cannot run here
            await asyncio.wait_for(stream.__anext__(), 0.3)
        assert calls[0]["sampling_params"].return_generation_logits  # TensorRT-LLM computes logprobs from them
        with pytest.raises(UnsupportedOptionError) as info:
            await collect(engine, GenerationRequest("p", prompt="hi", sampling=SamplingOptions(prompt_logprobs=1)))
        assert info.value.param == "prompt_logprobs" and "--gather_context_logits" in info.value.message
        assert len(calls) == 1
    (tmp_path / "engine").rename(tmp_path / "old")
    async with running(make_config(engine_folder(tmp_path, gather_context_logits=True),
                                   tokenizer=str(model_dir))) as engine:
        calls = recording(engine)
        stream = engine.generate(GenerationRequest("p", prompt="hi", sampling=SamplingOptions(prompt_logprobs=1)))
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(stream.__anext__(), 0.3)
        assert calls[0]["sampling_params"].prompt_logprobs == 1
