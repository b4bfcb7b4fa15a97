"""TrtllmEngine over the fake tensorrt_llm: tokens, the SamplingParams it builds, rejections, abort,
stats and LoRA. The fake runs the tiny checkpoint with transformers, so token ids are checked exactly
against transformers' own greedy continuation.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from runtime.errors import (InvalidRequestError, PromptTooLongError, UnknownAdapterError,
                            UnsupportedOptionError)
from runtime.errors import UnknownLoraTaskError
from runtime.request import GenerationRequest, LoraTask, OutputDelta, SamplingOptions
from tests.engine_harness import hf_greedy, load_hf
from tests.fakes.trtllm import collect, drained, fake_trtllm, make_config, recording, running  # noqa: F401
from tests.tiny_models import build_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("trtllm"), "llama")


def adapter_dir(root: Path, name: str, modules: list[str]) -> str:
    folder = root / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "target_modules": modules}))
    return str(folder)


async def test_greedy_tokens_match_transformers_with_usage(fake_trtllm, model_dir):
    async with running(make_config(model_dir)) as engine:
        prompt = engine.tokenizer.encode("the cat sat")
        req = GenerationRequest("g", prompt_token_ids=prompt,
                                sampling=SamplingOptions(max_tokens=5, temperature=0.0, ignore_eos=True))
        deltas = await collect(engine, req)
        tokens = [t for d in deltas for t in d.token_ids]
        assert tokens == hf_greedy(load_hf(model_dir), prompt, 5)
        assert deltas[0].prompt_token_ids == prompt
        assert [d.finish_reason for d in deltas] == [None] * 4 + ["length"]
        assert deltas[-1].usage.prompt_tokens == len(prompt)
        assert deltas[-1].usage.completion_tokens == 5
        assert "".join(d.text for d in deltas) == engine.tokenizer.decode(tokens)


async def test_every_sampling_option_reaches_sampling_params(fake_trtllm, model_dir):
    async with running(make_config(model_dir, seed=7)) as engine:
        calls = recording(engine)
        eos = engine.tokenizer.eos_token_ids
        options = SamplingOptions(
            max_tokens=3, temperature=0.5, top_k=5, top_p=0.9, min_p=0.05, repetition_penalty=1.2,
            presence_penalty=0.3, frequency_penalty=0.4, min_tokens=1, logit_bias={5: 2.5, 7: -100.0},
            bad_words=["dog"], stop_token_ids=[11], include_stop_str_in_output=True, n=2, logprobs=2,
            prompt_logprobs=1, return_context_logits=True, return_generation_logits=True,
            skip_special_tokens=False)
        await collect(engine, GenerationRequest("o", prompt="hello world", sampling=options,
                                                add_special_tokens=False))
        sp = calls[0]["sampling_params"]
        assert calls[0]["streaming"] is True and calls[0]["lora_request"] is None
        assert calls[0]["inputs"] == engine.tokenizer.encode("hello world", add_special_tokens=False)
        assert (sp.max_tokens, sp.temperature, sp.top_k, sp.top_p, sp.min_p) == (3, 0.5, 5, 0.9, 0.05)
        assert (sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty) == (1.2, 0.3, 0.4)
        assert (sp.min_tokens, sp.seed, sp.n, sp.best_of, sp.use_beam_search) == (1, 7, 2, 2, False)
        assert sp.end_id == eos[0] and sp.stop_token_ids == [11, *eos[1:]]
        assert sp.bad == ["dog", " dog"] and sp.stop is None  # stop strings are matched on our text
        assert (sp.logprobs, sp.prompt_logprobs) == (2, 1)
        assert sp.return_context_logits and sp.return_generation_logits and sp.include_stop_str_in_output
        assert (sp.detokenize, sp.skip_special_tokens, sp.add_special_tokens) == (False, False, False)
        assert sp.exclude_input_from_output is True and sp.ignore_eos is False
        bias = torch.zeros(engine.folder.vocab_size)
        bias[5], bias[7] = 2.5, -100.0
        assert torch.equal(sp.embedding_bias, bias)


async def test_requests_without_max_tokens_get_the_default_within_the_window(fake_trtllm, model_dir):
    async with running(make_config(model_dir, max_model_len=64, default_max_tokens=12)) as engine:
        calls = recording(engine)
        for prompt in ([5] * 10, [5] * 60):
            await collect(engine, GenerationRequest(f"d{len(prompt)}", prompt_token_ids=prompt))
        assert [c["sampling_params"].max_tokens for c in calls] == [12, 4]


@pytest.mark.parametrize("request_kw, option", [
    ({"num_draft_tokens": 3}, "num_draft_tokens"),
    ({"use_draft_logits": True}, "use_draft_logits"),
    ({"sampling": SamplingOptions(beam_width=2, logprobs=1)}, "logprobs"),
    ({"lora_task": LoraTask(task_id=9, weights=[[0.0]], config=[[0, 0, 1]])}, "lora_weights"),
])
async def test_unsupported_options_are_rejected_by_name(fake_trtllm, model_dir, request_kw, option):
    async with running(make_config(model_dir)) as engine:
        with pytest.raises(UnsupportedOptionError) as info:
            await collect(engine, GenerationRequest("u", prompt="hi", **request_kw))
        assert info.value.param == option
        assert info.value.message.startswith(f"'{option}' is not supported by the trtllm backend")
        assert not engine.llm._executor._results  # nothing reached TensorRT-LLM


async def test_prompt_too_long_and_bad_token_ids(fake_trtllm, model_dir):
    async with running(make_config(model_dir, max_model_len=16)) as engine:
        with pytest.raises(PromptTooLongError):
            await collect(engine, GenerationRequest("l", prompt_token_ids=[5] * 10,
                                                    sampling=SamplingOptions(max_tokens=7)))
        with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
            await collect(engine, GenerationRequest("v", prompt_token_ids=[5, 10**6]))


async def test_closing_the_stream_and_abort_cancel_the_trtllm_request(fake_trtllm, model_dir):
    async with running(make_config(model_dir)) as engine:
        options = SamplingOptions(max_tokens=200, temperature=0.0, ignore_eos=True)
        stream = engine.generate(GenerationRequest("c", prompt="a b", sampling=options))
        await stream.__anext__()
        await stream.aclose()  # the client went away
        assert await drained(engine) and not engine._results

        deltas: list[OutputDelta] = []
        async for delta in engine.generate(GenerationRequest("a", prompt="a b", sampling=options)):
            deltas.append(delta)
            if len(deltas) == 2:
                engine.abort("a")
        assert deltas[-1].finish_reason == "abort"
        assert deltas[-1].usage.completion_tokens == sum(len(d.token_ids) for d in deltas) < 200


async def test_stop_string_ends_the_sequence_and_frees_trtllm(fake_trtllm, model_dir):
    async with running(make_config(model_dir)) as engine:
        greedy = SamplingOptions(max_tokens=8, temperature=0.0, ignore_eos=True)
        full = "".join(d.text for d in await collect(engine, GenerationRequest("f", prompt="x", sampling=greedy)))
        stop = full[3:5]
        greedy.stop = [stop]
        deltas = await collect(engine, GenerationRequest("s", prompt="x", sampling=greedy))
        assert "".join(d.text for d in deltas) == full[: full.index(stop)]
        assert (deltas[-1].finish_reason, deltas[-1].stop_reason) == ("stop", stop)
        assert await drained(engine)  # the stop string aborted the TensorRT-LLM request


async def test_a_stop_string_counts_from_min_tokens_and_cuts_ids_and_usage(fake_trtllm, model_dir):
    """The front end's OutputProcessor, as for the native engine: the ids end at the token that completed the stop
    string (usage too), and no stop string matches before min_tokens tokens."""
    async with running(make_config(model_dir)) as engine:
        greedy = SamplingOptions(max_tokens=12, temperature=0.0, ignore_eos=True)
        tokens = [t for d in await collect(engine, GenerationRequest("f", prompt="x", sampling=greedy)) for t in d.token_ids]
        full = engine.tokenizer.decode(tokens)
        stop = full[3:5]
        k = next(i for i in range(1, len(tokens) + 1) if stop in engine.tokenizer.decode(tokens[:i]))
        greedy.stop = [stop]
        deltas = await collect(engine, GenerationRequest("s", prompt="x", sampling=greedy))
        assert [t for d in deltas for t in d.token_ids] == tokens[:k] and deltas[-1].usage.completion_tokens == k
        greedy.min_tokens = k + 1  # the k-th token completes it: too early
        deltas = await collect(engine, GenerationRequest("m", prompt="x", sampling=greedy))
        ids = [t for d in deltas for t in d.token_ids]
        assert len(ids) > k and deltas[-1].usage.completion_tokens == len(ids)
        assert "".join(d.text for d in deltas).startswith(full[: full.index(stop) + len(stop)])  # not cut there
        assert await drained(engine)


async def test_stats_come_from_iteration_stats(fake_trtllm, model_dir):
    async with running(make_config(model_dir)) as engine:
        prompt = engine.tokenizer.encode("one two")
        await collect(engine, GenerationRequest("s", prompt_token_ids=prompt,
                                                sampling=SamplingOptions(max_tokens=4, ignore_eos=True)))
        for _ in range(100):
            if engine.stats().iterations >= 4:
                break
            await asyncio.sleep(0.05)
        s = engine.stats()
        assert s.iterations == 4  # one token per iteration in the fake
        assert (s.kv_tokens_per_block, s.kv_blocks_total) == (16, 1024 // 16)
        assert s.prompt_tokens_total == len(prompt) and s.generation_tokens_total == 4
        assert s.prefill_tokens_computed == len(prompt)
        assert s.max_batch_size == 4
        # Idle: TRT-LLM reports no further iteration, so the last one's occupancy must not linger.
        assert (s.running, s.waiting, s.kv_blocks_used, s.kv_blocks_free) == (0, 0, 0, 1024 // 16)


async def test_lora_requests_names_ids_and_run_time_loading(fake_trtllm, model_dir, tmp_path):
    first = adapter_dir(tmp_path, "first", ["q_proj", "v_proj"])
    async with running(make_config(model_dir, lora_modules={"first": first}, max_lora_rank=8)) as engine:
        calls = recording(engine)
        lora_config = engine.llm_kwargs["lora_config"]
        assert (lora_config.lora_dir, lora_config.lora_target_modules) == ([first], ["attn_q", "attn_v"])
        assert (lora_config.max_lora_rank, lora_config.max_loras, lora_config.max_cpu_loras) == (8, 8, 32)
        opts = SamplingOptions(max_tokens=1)
        await collect(engine, GenerationRequest("a", prompt="hi", adapter="first", sampling=opts))
        lora = calls[-1]["lora_request"]
        assert (lora.lora_name, lora.lora_path) == ("first", first)
        # A Triton lora_task_id naming the registered adapter's id reaches the same adapter.
        await collect(engine, GenerationRequest("t", prompt="hi", lora_task=LoraTask(task_id=1), sampling=opts))
        assert calls[-1]["lora_request"] == lora
        with pytest.raises(UnknownLoraTaskError, match="LoRA task 77 not found in cache"):  # a 400, as native
            await collect(engine, GenerationRequest("u", prompt="hi", lora_task=LoraTask(task_id=77), sampling=opts))

        second = adapter_dir(tmp_path, "second", ["v_proj"])
        await engine.load_lora_adapter("second", second)
        assert engine.lora_adapters() == {"first": first, "second": second}
        await collect(engine, GenerationRequest("b", prompt="hi", adapter="second", sampling=opts))
        assert calls[-1]["lora_request"].lora_path == second
        assert calls[-1]["lora_request"].lora_int_id != lora.lora_int_id
        assert engine.stats().lora_requests == {"first": 2, "second": 1}

        await engine.unload_lora_adapter("second")
        with pytest.raises(UnknownAdapterError):
            await collect(engine, GenerationRequest("c", prompt="hi", adapter="second", sampling=opts))
        await engine.load_lora_adapter("second", second)  # same name again: a fresh cache key
        await collect(engine, GenerationRequest("d", prompt="hi", adapter="second", sampling=opts))
        assert calls[-1]["lora_request"].lora_int_id not in (lora.lora_int_id, calls[-2]["lora_request"].lora_int_id)

        wide = adapter_dir(tmp_path, "wide", ["o_proj"])
        with pytest.raises(InvalidRequestError, match="outside the modules"):
            await engine.load_lora_adapter("wide", wide)
        with pytest.raises(InvalidRequestError, match="already been loaded"):
            await engine.load_lora_adapter("first", first)


async def test_lora_needs_adapters_at_start(fake_trtllm, model_dir, tmp_path):
    async with running(make_config(model_dir)) as engine:
        assert "lora_config" not in engine.llm_kwargs
        with pytest.raises(UnsupportedOptionError, match="load_lora_adapter"):
            await engine.load_lora_adapter("x", adapter_dir(tmp_path, "x", ["q_proj"]))
