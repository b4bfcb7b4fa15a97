"""Guided decoding on the TensorRT-LLM backend: what the OpenAI layer asks for reaches GuidedDecodingParams,
and each guide is one that TensorRT-LLM's xgrammar backend compiles and enforces.

TensorRT-LLM 1.2 turns GuidedDecodingParams into an executor guide (SamplingParams._get_guided_decoding_params:
a `json` dict is json.dumps'ed, json_object is the built-in JSON grammar) and compiles it in
XGrammarMatcherFactory.create (tensorrt_llm/_torch/pyexecutor/grammar_matcher.py): compile_json_schema,
compile_builtin_json_grammar, compile_regex, compile_grammar, compile_structural_tag. The fake decodes
under those guides the same way (tests/fakes/tensorrt_llm/_guided.py); the JSON ones are checked here by
what they accept, since TensorRT-LLM's JSON grammars allow free whitespace, in which a random model wanders.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import xgrammar as xgr
from transformers import AutoTokenizer

from adapters.openai.response_format import ResponseFormat, response_format_guided
from adapters.openai.tools import HERMES, LLAMA3_JSON, NamedToolChoice, ToolSpec, tool_guided
from runtime.config import EngineConfig
from runtime.errors import UnsupportedOptionError
from runtime.request import GenerationRequest, GuidedDecoding, SamplingOptions
from tests.fakes.trtllm import fake_trtllm  # noqa: F401  (fixture)
from tests.tiny_models import build_tiny_model

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
          "required": ["city", "days"], "additionalProperties": False}
TOOLS = [ToolSpec.model_validate({"type": "function", "function": {"name": name, "parameters": SCHEMA}})
         for name in ("get_weather", "get_time")]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("guided_trtllm"), "llama")


async def run_guided(model_dir: Path, guides: list[GuidedDecoding], max_tokens: int = 1,
                     **sampling: Any) -> tuple[list[Any], list[tuple[str, str | None]], dict[str, Any]]:
    """Greedy requests under `guides` (and `sampling` options): the guided_decoding of the SamplingParams
    each reached the LLM with, each one's (text, finish_reason), and the LLM's kwargs."""
    from runtime.trtllm.engine import TrtllmEngine

    engine = TrtllmEngine(EngineConfig(model=str(model_dir), backend="trtllm", max_batch_size=4,
                                       max_kv_tokens=1024, kv_block_size=16))
    await engine.start()
    sent: list[Any] = []
    real = engine.llm.generate_async

    def spy(inputs: Any, **kwargs: Any) -> Any:
        sent.append(kwargs["sampling_params"].guided_decoding)
        return real(inputs, **kwargs)

    engine.llm.generate_async = spy
    outputs = []
    try:
        for i, guided in enumerate(guides):
            request = GenerationRequest(f"g{i}", prompt="hi", guided=guided,
                                        sampling=SamplingOptions(max_tokens=max_tokens, temperature=0.0, **sampling))
            deltas = [d async for d in engine.generate(request)]
            outputs.append(("".join(d.text for d in deltas), deltas[-1].finish_reason))
        return sent, outputs, engine.llm_kwargs
    finally:
        await engine.shutdown()


def accepts(compiled: xgr.CompiledGrammar, tok: Any, text: str) -> bool:
    """Whether a matcher on `compiled` accepts `text` token by token and may end after it."""
    matcher = xgr.GrammarMatcher(compiled)
    return all(matcher.accept_token(t) for t in tok.encode(text, add_special_tokens=False)) and \
        matcher.accept_token(tok.eos_token_id)


async def test_openai_constraints_map_onto_guided_decoding_params(fake_trtllm, model_dir: Path) -> None:
    from tensorrt_llm import GuidedDecodingParams

    json_schema = response_format_guided(ResponseFormat.model_validate(
        {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA, "strict": True}}))
    json_object = response_format_guided(ResponseFormat(type="json_object"))
    named = NamedToolChoice.model_validate({"type": "function", "function": {"name": "get_time"}})
    hermes_named = tool_guided(TOOLS, named, HERMES)
    llama_required = tool_guided(TOOLS, "required", LLAMA3_JSON)
    sent, _, llm_kwargs = await run_guided(model_dir, [json_schema, json_object, hermes_named, llama_required,
                                                     GuidedDecoding(regex="[0-9]+"),
                                                     GuidedDecoding(grammar='root ::= "yes" | "no"')])
    assert llm_kwargs["guided_decoding_backend"] == "xgrammar"  # without it the real LLM refuses guides
    assert sent[0] == GuidedDecodingParams(json=SCHEMA)
    assert sent[1] == GuidedDecodingParams(json_object=True)
    assert sent[2] == GuidedDecodingParams(structural_tag=json.dumps(hermes_named.structural_tag))
    assert sent[3] == GuidedDecodingParams(structural_tag=json.dumps(llama_required.structural_tag))
    assert sent[4] == GuidedDecodingParams(regex="[0-9]+")
    assert sent[5] == GuidedDecodingParams(grammar='root ::= "yes" | "no"')

    # What TensorRT-LLM's xgrammar backend then compiles from them, and what it lets through.
    tok = AutoTokenizer.from_pretrained(model_dir)
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, stop_token_ids=[tok.eos_token_id]))
    weather = '{"city": "Oslo", "days": 2}'
    assert accepts(compiler.compile_json_schema(json.dumps(sent[0].json)), tok, weather)
    assert not accepts(compiler.compile_json_schema(json.dumps(sent[0].json)), tok, '{"city": "Oslo"}')
    assert accepts(compiler.compile_builtin_json_grammar(), tok, '{"any": [1, null]}')
    hermes = compiler.compile_structural_tag(sent[2].structural_tag)
    assert accepts(hermes, tok, f'<tool_call>\n{{"name": "get_time", "arguments": {weather}}}\n</tool_call>')
    assert not accepts(hermes, tok, f'<tool_call>\n{{"name": "get_weather", "arguments": {weather}}}\n</tool_call>')
    llama = compiler.compile_structural_tag(sent[3].structural_tag)
    assert accepts(llama, tok, f'{{"name": "get_weather", "parameters": {weather}}}')
    assert accepts(llama, tok, f'{{"name": "get_time", "parameters": {weather}}}')
    assert not accepts(llama, tok, f'{{"name": "get_time", "arguments": {weather}}}')
    assert accepts(compiler.compile_regex(sent[4].regex), tok, "42")
    assert accepts(compiler.compile_grammar(sent[5].grammar), tok, "no")


async def test_the_backend_decodes_under_its_guides(fake_trtllm, model_dir: Path) -> None:
    guides = [GuidedDecoding(regex="(yes|no)-[0-9]{2}"), GuidedDecoding(grammar='root ::= "[" ("a" | "b")+ "]"'),
              None]
    _, outputs, _ = await run_guided(model_dir, guides, max_tokens=12)  # type: ignore[arg-type]
    (regex_text, regex_finish), (ebnf_text, ebnf_finish), (free_text, _) = outputs
    assert re.fullmatch("(yes|no)-[0-9]{2}", regex_text) and regex_finish == "stop"  # then only eos was allowed
    assert re.fullmatch(r"\[[ab]+\]" if ebnf_finish == "stop" else r"\[[ab]*", ebnf_text)
    assert not re.fullmatch("(yes|no)-[0-9]{2}", free_text)  # the same prompt, unconstrained


@pytest.mark.parametrize("option, sampling", [("ignore_eos", {"ignore_eos": True}), ("min_tokens", {"min_tokens": 20}),
                                              ("ignore_eos", {"ignore_eos": True, "stop_token_ids": [7]})])
async def test_options_that_would_run_past_the_grammar_are_refused(fake_trtllm, model_dir: Path, option: str,
                                                                   sampling: dict[str, Any]) -> None:
    # TensorRT-LLM stops masking at the grammar's end; these went on unconstrained to max_tokens (finish "length").
    with pytest.raises(UnsupportedOptionError) as refused:
        await run_guided(model_dir, [GuidedDecoding(regex="(yes|no)-[0-9]{2}", param="response_format")],
                         max_tokens=40, **sampling)
    assert refused.value.param == option
    assert str(refused.value).startswith(f"'{option}' is not supported by the trtllm backend: "
                                         "guided decoding ('response_format')")


async def test_ignore_eos_with_the_end_token_as_stop_token_still_ends_at_the_grammar(fake_trtllm,
                                                                                     model_dir: Path) -> None:
    # Triton's end_id set to the model's end token: ignore_eos, the end token a stop token; the grammar ends it.
    eos = AutoTokenizer.from_pretrained(model_dir).eos_token_id
    _, [(text, finish)], _ = await run_guided(model_dir, [GuidedDecoding(regex="(yes|no)-[0-9]{2}")], max_tokens=40,
                                              ignore_eos=True, stop_token_ids=[eos])
    assert re.fullmatch("(yes|no)-[0-9]{2}", text) and finish == "stop"
