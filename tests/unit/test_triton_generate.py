"""Generate-extension request parsing and its mapping onto runtime requests (adapters/triton)."""

from __future__ import annotations

from typing import Any

import pytest

from adapters.triton.generate import TritonGenerate, model_kind, parse_generate
from runtime.errors import InvalidRequestError
from runtime.request import GuidedDecoding, SamplingOptions
from runtime.tokenizer import Tokenizer

DOC_EXAMPLE = {"text_input": "What is machine learning?", "max_tokens": 20, "bad_words": "", "stop_words": ""}


def parse(tokenizer: Tokenizer, body: Any, model: str = "ensemble", **kw: Any) -> TritonGenerate:
    kind = "ids" if model == "tensorrt_llm" else "text"
    return parse_generate(body, model_name=model, model_version="1", kind=kind, tokenizer=tokenizer,
                          request_id="req", **kw)


def sampling(tokenizer: Tokenizer, **inputs: Any) -> SamplingOptions:
    return parse(tokenizer, {"text_input": "hi", "max_tokens": 5, **inputs}).requests[0].sampling


def test_model_names() -> None:
    assert model_kind("ensemble", "demo") == "text"
    assert model_kind("tensorrt_llm_bls", "demo") == "text"
    assert model_kind("demo", "demo") == "text"
    assert model_kind("tensorrt_llm", "demo") == "ids"
    assert model_kind("preprocessing", "demo") is None


def test_documented_example(tokenizer: Tokenizer) -> None:
    gen = parse(tokenizer, DOC_EXAMPLE)
    assert len(gen.requests) == 1 and not gen.batched
    req = gen.requests[0]
    assert req.request_id == "req" and req.prompt == "What is machine learning?" and req.prompt_token_ids is None
    # Triton's defaults: greedy (no top-k/top-p), TRT-LLM's fixed seed, no stop/bad words
    assert req.sampling == SamplingOptions(max_tokens=20, top_k=1, seed=0, include_stop_str_in_output=True)
    assert gen.exclude_input_in_output is False and gen.stream is None
    assert not (gen.return_log_probs or gen.return_context_logits or gen.return_generation_logits)


def test_inputs_inside_parameters_and_one_element_lists(tokenizer: Tokenizer) -> None:
    gen = parse(tokenizer, {"text_input": ["hello"], "parameters": {"max_tokens": [7], "temperature": 0.5,
                                                                    "top_p": 0.9, "stream": True}})
    req = gen.requests[0]
    assert req.prompt == "hello" and not gen.batched
    assert (req.sampling.max_tokens, req.sampling.temperature, req.sampling.top_p, req.sampling.top_k) == (7, 0.5, 0.9, 0)
    assert gen.stream is True


@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        ({}, {"top_k": 1, "top_p": 1.0}),  # neither: greedy
        ({"top_k": 0, "top_p": 0.0}, {"top_k": 1, "top_p": 1.0}),  # both "off": greedy
        ({"top_k": 40}, {"top_k": 40, "top_p": 1.0}),
        ({"top_p": 0.8}, {"top_k": 0, "top_p": 0.8}),
        ({"top_k": 5, "top_p": 0.0}, {"top_k": 5, "top_p": 1.0}),
        ({"runtime_top_k": 3, "runtime_top_p": 0.5}, {"top_k": 3, "top_p": 0.5}),
    ],
)
def test_top_k_top_p_as_trtllm(tokenizer: Tokenizer, inputs: dict, expected: dict) -> None:
    s = sampling(tokenizer, **inputs)
    assert {"top_k": s.top_k, "top_p": s.top_p} == expected


def test_every_sampling_input(tokenizer: Tokenizer) -> None:
    s = sampling(tokenizer, temperature=0.7, top_k=10, len_penalty=1.5, repetition_penalty=1.2, min_length=3,
                 presence_penalty=0.3, frequency_penalty=0.4, random_seed=2**63, beam_width=2,
                 return_log_probs=True, return_context_logits=True, return_generation_logits=True,
                 bad_words=["foo", "", "bar"], stop_words="\n\n", end_id=7)
    assert s == SamplingOptions(
        max_tokens=5, temperature=0.7, top_k=10, length_penalty=1.5, repetition_penalty=1.2, min_tokens=3,
        presence_penalty=0.3, frequency_penalty=0.4, seed=2**63, beam_width=2, logprobs=0,
        return_context_logits=True, return_generation_logits=True, bad_words=["foo", "bar"], stop=["\n\n"],
        include_stop_str_in_output=True, ignore_eos=True, stop_token_ids=[7],
    )


def test_ensemble_aliases(tokenizer: Tokenizer) -> None:
    s = sampling(tokenizer, length_penalty=2.0, min_tokens=4, seed=9, num_return_sequences=3)
    assert (s.length_penalty, s.min_tokens, s.seed, s.n) == (2.0, 4, 9, 3)


def test_end_id_minus_one_never_stops_early(tokenizer: Tokenizer) -> None:
    s = sampling(tokenizer, end_id=-1)
    assert s.ignore_eos is True and s.stop_token_ids == []


def test_embedding_bias_words_bias_every_token_of_the_word(tokenizer: Tokenizer) -> None:
    hello = tokenizer.encode("hello", add_special_tokens=False)
    world = tokenizer.encode(" world", add_special_tokens=False)
    s = sampling(tokenizer, embedding_bias_words=["hello", " world", "hello"], embedding_bias_weights=[1.5, -2.0, 0.5])
    expected: dict[int, float] = {}
    for ids, w in ((hello, 1.5), (world, -2.0), (hello, 0.5)):
        for i in ids:
            expected[i] = expected.get(i, 0.0) + w
    assert s.logit_bias == expected
    with pytest.raises(InvalidRequestError, match="must have the same number of elements"):
        sampling(tokenizer, embedding_bias_words=["a"], embedding_bias_weights=[1.0, 2.0])


def test_speculation_and_guided_decoding(tokenizer: Tokenizer) -> None:
    gen = parse(tokenizer, {**DOC_EXAMPLE, "num_draft_tokens": 3, "use_draft_logits": True,
                            "guided_decoding_guide_type": "json_schema", "guided_decoding_guide": '{"type": "object"}'})
    req = gen.requests[0]
    assert (req.num_draft_tokens, req.use_draft_logits) == (3, True)
    assert req.guided == GuidedDecoding(json_schema={"type": "object"}, param="guided_decoding_guide")
    assert parse(tokenizer, {**DOC_EXAMPLE, "guided_decoding_guide_type": "json"}).requests[0].guided == \
        GuidedDecoding(json_object=True)
    assert parse(tokenizer, DOC_EXAMPLE).requests[0].num_draft_tokens is None


def test_batch_of_prompts(tokenizer: Tokenizer) -> None:
    gen = parse(tokenizer, {"text_input": ["a", "b", "c"], "max_tokens": 4, "stop_words": ["x"]})
    assert gen.batched and [r.prompt for r in gen.requests] == ["a", "b", "c"]
    assert [r.request_id for r in gen.requests] == ["req-0", "req-1", "req-2"]
    assert all(r.sampling.max_tokens == 4 and r.sampling.stop == ["x"] for r in gen.requests)
    assert gen.requests[0].sampling is not gen.requests[1].sampling
    assert gen.requests[0].sampling.stop is not gen.requests[1].sampling.stop


def test_exclude_input_default_and_override(tokenizer: Tokenizer) -> None:
    assert parse(tokenizer, DOC_EXAMPLE, exclude_input_default=True).exclude_input_in_output is True
    body = {**DOC_EXAMPLE, "exclude_input_in_output": False}
    assert parse(tokenizer, body, exclude_input_default=True).exclude_input_in_output is False


def test_ids_model(tokenizer: Tokenizer) -> None:
    gen = parse(tokenizer, {"input_ids": [[5, 6, 7, 0]], "input_lengths": [3], "request_output_len": [9],
                            "runtime_top_k": 2, "streaming": True, "stop_words_list": [[[11, 12], [1, 2]]],
                            "embedding_bias": [0.0, 0.0, 3.0]}, model="tensorrt_llm")
    req = gen.requests[0]
    assert req.prompt is None and req.prompt_token_ids == [5, 6, 7]
    assert req.sampling.max_tokens == 9 and req.sampling.top_k == 2 and gen.stream is True
    assert req.sampling.stop_token_ids == [11, 12] and req.sampling.logit_bias == {2: 3.0}
    batch = parse(tokenizer, {"input_ids": [[1, 2, 3], [4, 5, 0]], "input_lengths": [3, 2],
                              "request_output_len": 2}, model="tensorrt_llm")
    assert batch.batched and [r.prompt_token_ids for r in batch.requests] == [[1, 2, 3], [4, 5]]
    with pytest.raises(InvalidRequestError, match="only single-token stop words"):
        parse(tokenizer, {"input_ids": [1], "input_lengths": 1, "request_output_len": 2,
                          "stop_words_list": [[1, 2], [2, -1]]}, model="tensorrt_llm")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({**DOC_EXAMPLE, "foo": 1, "parameters": {"bar": 2}}, "unexpected inference inputs 'bar', 'foo' for model 'ensemble'"),
        ({"text_input": "x"}, "missing required input 'max_tokens' for model 'ensemble'"),
        ({"max_tokens": 3}, "missing required input 'text_input'"),
        ({**DOC_EXAMPLE, "max_tokens": "20"}, "input 'max_tokens' must be a 32-bit integer, got a string"),
        ({**DOC_EXAMPLE, "max_tokens": 0}, "input 'max_tokens' must be at least 1, got 0"),
        ({**DOC_EXAMPLE, "max_tokens": [1, 2]}, "input 'max_tokens' takes one value, got 2"),
        ({**DOC_EXAMPLE, "temperature": True}, "input 'temperature' must be a number, got a boolean"),
        ({**DOC_EXAMPLE, "stream": 1}, "input 'stream' must be a boolean"),
        ({**DOC_EXAMPLE, "top_p": 1.5}, "input 'top_p' must be within [0, 1]"),
        ({**DOC_EXAMPLE, "random_seed": -1}, "input 'random_seed' must be an unsigned 64-bit integer"),
        ({**DOC_EXAMPLE, "seed": 1, "random_seed": 2}, "input 'random_seed' is given twice"),
        ({**DOC_EXAMPLE, "parameters": {"max_tokens": 3}}, "input 'max_tokens' is given twice"),
        ({**DOC_EXAMPLE, "bad_words": 3}, "input 'bad_words' must be a string or a list of strings"),
        ({**DOC_EXAMPLE, "prompt_vocab_size": 5}, "input 'prompt_vocab_size' is not supported yet"),
        ({**DOC_EXAMPLE, "lora_weights": [[0.1]], "lora_config": [[0, 0, 1]]}, "need a lora_task_id"),
        ({**DOC_EXAMPLE, "end_id": -2}, "input 'end_id' must be a token id or -1"),
        ({**DOC_EXAMPLE, "guided_decoding_guide_type": "xml"}, "must be one of json, json_schema, regex"),
        # valid JSON that is no schema object reached the engine core, which died on it
        *(({**DOC_EXAMPLE, "guided_decoding": value}, "input 'guided_decoding' must be a JSON schema object, got JSON")
          for value in ("1", "[]", "true", '"s"', "null")),
        ({**DOC_EXAMPLE, "guided_decoding_guide_type": "json_schema", "guided_decoding_guide": "[1]"},
         "input 'guided_decoding_guide' must be a JSON schema object, got JSON list"),
        # 100k brackets were a 500 (RecursionError)
        ({**DOC_EXAMPLE, "guided_decoding": "[" * 100_000}, "input 'guided_decoding' is nested too deeply"),
        ({**DOC_EXAMPLE, "guided_decoding": "{"}, "input 'guided_decoding' is not valid JSON"),
        ([1, 2], "the request body must be a JSON object"),
        ({**DOC_EXAMPLE, "parameters": [1]}, "'parameters' must be a JSON object"),
    ],
)
def test_bad_requests_name_the_input(tokenizer: Tokenizer, body: Any, message: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse(tokenizer, body)
    assert message in info.value.message


def test_unsupported_inputs_with_neutral_values_are_accepted(tokenizer: Tokenizer) -> None:
    gen = parse(tokenizer, {**DOC_EXAMPLE, "return_perf_metrics": False, "prompt_vocab_size": 0})
    assert gen.requests[0].adapter is None and gen.requests[0].lora_task is None


def test_ids_model_errors(tokenizer: Tokenizer) -> None:
    with pytest.raises(InvalidRequestError, match="missing required inputs 'input_lengths', 'request_output_len'"):
        parse(tokenizer, {"input_ids": [1, 2]}, model="tensorrt_llm")
    with pytest.raises(InvalidRequestError, match="unexpected inference input 'text_input' for model 'tensorrt_llm'"):
        parse(tokenizer, {"text_input": "x", "input_ids": [1], "input_lengths": 1, "request_output_len": 1},
              model="tensorrt_llm")
    with pytest.raises(InvalidRequestError, match="value 5 is not within 1..2"):
        parse(tokenizer, {"input_ids": [1, 2], "input_lengths": 5, "request_output_len": 1}, model="tensorrt_llm")
    with pytest.raises(InvalidRequestError, match="must be a non-empty list of token ids"):
        parse(tokenizer, {"input_ids": [], "input_lengths": 0, "request_output_len": 1}, model="tensorrt_llm")


@pytest.mark.parametrize("name", ["temperature", "embedding_bias_weights"])
def test_an_integer_past_the_float_range_is_a_400_naming_the_input(tokenizer: Tokenizer, name: str) -> None:
    huge = 10**400  # JSON allows it; float() overflows (was a 500)
    body = {"text_input": "hi", "max_tokens": 5, name: huge if name == "temperature" else [huge],
            "embedding_bias_words": ["hi"]}
    with pytest.raises(InvalidRequestError) as info:
        parse(tokenizer, body)
    assert info.value.param == name
