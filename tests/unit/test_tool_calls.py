"""adapters/openai/tools.py: format detection, parsing, streaming split, constraints, request checks."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr
from pydantic import BaseModel
from transformers import AutoTokenizer

from adapters.openai.requests import ChatCompletionRequest
from adapters.openai.tools import (
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    SMOLLM2,
    ToolCallStream,
    chat_guided,
    tool_call_format,
    with_tool_calls,
)
from runtime.errors import InvalidRequestError
from runtime.native.guided import GuidedCompiler
from runtime.native.guided.grammars import build_grammar
from tests.tiny_models import build_tiny_model

TOOL = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}
HERMES_TEXT = ('Let me check. <tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n'
               '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>')


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})


def test_format_follows_the_chat_template() -> None:
    assert tool_call_format("... <tool_call>{{ x }}</tool_call> ...") is HERMES
    assert tool_call_format("{{ messages | tojson }}") is LLAMA3_JSON
    assert tool_call_format({"default": "<tool_call>", "rag": "x"}) is HERMES  # named templates


def test_hermes_parse() -> None:
    content, calls = HERMES.parse(HERMES_TEXT)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"x": 1}), ("g", {})]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)
    # a call cut off before its closing tag (eos) still counts; broken JSON stays text
    assert [c.name for c in HERMES.parse('<tool_call>\n{"name": "f", "arguments": {}}')[1]] == ["f"]
    assert HERMES.parse("<tool_call>{oops</tool_call>") == ("<tool_call>{oops</tool_call>", [])
    assert HERMES.parse("plain answer") == ("plain answer", [])


def test_llama3_parse() -> None:
    content, calls = LLAMA3_JSON.parse(' {"name": "f", "parameters": {"x": 2}}; {"name": "g", "parameters": {}}')
    assert content is None and [(c.name, c.arguments) for c in calls] == [("f", '{"x": 2}'), ("g", "{}")]
    assert LLAMA3_JSON.parse('{"no": "name"}') == ('{"no": "name"}', [])
    assert LLAMA3_JSON.parse("Hello {there}") == ("Hello {there}", [])


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_streaming_split_matches_the_whole_parse(step: int) -> None:
    stream = ToolCallStream(HERMES)
    pieces = [stream.push(HERMES_TEXT[i:i + step]) for i in range(0, len(HERMES_TEXT), step)]
    pieces.append(stream.push("", final=True))
    content = "".join(p[0] for p in pieces)
    calls = [c for p in pieces for c in p[1]]
    assert content == "Let me check. "
    assert [(c["index"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == \
        [(0, "f", '{"x": 1}'), (1, "g", "{}")]
    assert stream.num_calls == 2


@pytest.mark.parametrize("step", [1, 1000])
def test_parallel_tool_calls_false_returns_the_first_call_only(step: int) -> None:
    single = tool_call_format("<tool_call>", parallel=False)
    content, calls = single.parse(HERMES_TEXT)
    assert content == "Let me check." and [c.name for c in calls] == ["f"]
    stream = ToolCallStream(single)
    pieces = [stream.push(HERMES_TEXT[i:i + step]) for i in range(0, len(HERMES_TEXT), step)]
    pieces.append(stream.push("", final=True))
    assert [c["function"]["name"] for p in pieces for c in p[1]] == ["f"] and stream.num_calls == 1
    assert "".join(p[0] for p in pieces) == "Let me check. "
    two = ' {"name": "f", "parameters": {}}; {"name": "g", "parameters": {}}'
    assert [c.name for c in tool_call_format("llama", parallel=False).parse(two)[1]] == ["f"]
    assert tool_call_format("<tool_call>", parallel=True) is HERMES


def test_streaming_holds_back_only_what_may_start_a_tag() -> None:
    stream = ToolCallStream(HERMES)
    assert stream.push("a <tool") == ("a ", [])
    assert stream.push("kit> b") == ("<toolkit> b", [])
    assert stream.push("<", final=True) == ("<", [])
    json_stream = ToolCallStream(LLAMA3_JSON)
    assert json_stream.push("Hi ") == ("Hi ", [])
    held = ToolCallStream(LLAMA3_JSON)
    assert held.push(' {"name": "f",') == ("", [])
    content, calls = held.push(' "parameters": {"x": 3}}', final=True)
    assert content == "" and calls[0]["function"] == {"name": "f", "arguments": '{"x": 3}'}


def merged(fmt, text: str, step: int) -> tuple[str, list[dict], int]:
    """push_deltas over `text` in pieces of `step`: (content, the calls merged as an SDK merges them, deltas)."""
    stream = ToolCallStream(fmt)
    pieces = [stream.push_deltas(text[i:i + step]) for i in range(0, len(text), step)]
    pieces.append(stream.push_deltas("", final=True))
    calls: dict[int, dict] = {}
    for entry in (e for p in pieces for e in p[1]):
        call = calls.setdefault(entry["index"], {"id": None, "name": None, "arguments": ""})
        if "id" in entry:
            assert call["id"] is None and entry["function"]["arguments"] == ""  # the first entry names the call
            call["id"], call["name"] = entry["id"], entry["function"]["name"]
        call["arguments"] += entry["function"]["arguments"]
    return "".join(p[0] for p in pieces), [calls[i] for i in sorted(calls)], sum(len(p[1]) for p in pieces)


MISTRAL_TEXT = 'Checking. [TOOL_CALLS][{"name": "f", "arguments": {"x": [1, {"y": "}"}]}}, {"name": "g", "arguments": {}}]'
LLAMA3_TEXT = '{"name": "f", "parameters": {"x": 2}}; {"name": "g", "parameters": {}}'


@pytest.mark.parametrize("fmt,text", [(HERMES, HERMES_TEXT), (MISTRAL, MISTRAL_TEXT), (LLAMA3_JSON, LLAMA3_TEXT)])
@pytest.mark.parametrize("step", [1, 4])
def test_arguments_stream_as_fragments_that_add_up_to_the_whole_parse(fmt, text: str, step: int) -> None:
    content, calls, deltas = merged(fmt, text, step)
    whole_content, whole = fmt.parse(text)
    assert [(c["name"], c["arguments"]) for c in calls] == [(c.name, c.arguments) for c in whole]
    assert content.strip() == (whole_content or "")
    assert deltas > len(calls) + 2  # the arguments came in several fragments, not one delta at the end
    assert all(c["id"].startswith("call_") for c in calls)


def test_mistral_format() -> None:
    assert tool_call_format("{{ '[TOOL_CALLS]' }} <tool_call>") is MISTRAL
    content, calls = MISTRAL.parse(MISTRAL_TEXT)
    assert content == "Checking." and [(c.name, json.loads(c.arguments)) for c in calls] == \
        [("f", {"x": [1, {"y": "}"}]}), ("g", {})]
    assert MISTRAL.parse("no calls here") == ("no calls here", [])
    fn = type("Fn", (), {"name": "f", "parameters": None})()
    elements = MISTRAL.call_structure(fn)["elements"]
    assert (elements[0]["value"], elements[-1]["value"]) == ("[TOOL_CALLS][", "]")


def test_a_call_cut_off_is_an_incomplete_call_never_markup_in_content() -> None:
    content, calls = HERMES.parse('Sure. <tool_call>\n{"name": "f", "arguments": {"x": 12')
    assert content == "Sure." and [(c.name, c.arguments) for c in calls] == [("f", '{"x": 12')]
    assert HERMES.parse('<tool_call>\n{"na') == ("", [])  # no name yet: dropped
    assert MISTRAL.parse('[TOOL_CALLS][{"name": "g", "argu') == ("", [])
    content, _, _ = merged(HERMES, 'Hi <tool_call>\n{"name"', 2)
    assert content == "Hi "
    assert with_tool_calls("length", True) == "length"


def test_finish_reason() -> None:
    assert with_tool_calls("stop", True) == "tool_calls"
    assert with_tool_calls("length", True) == "length"
    assert with_tool_calls("stop", False) == "stop"


def test_forced_choices_build_one_call_constraint() -> None:
    req = chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "f"}})
    tag = chat_guided(req.tools, req.tool_choice, req.response_format, HERMES).structural_tag
    elements = tag["format"]["elements"]
    assert [e["type"] for e in elements] == ["const_string", "json_schema", "const_string"]
    assert elements[1]["json_schema"]["properties"] == {"name": {"const": "f"},
                                                        "arguments": TOOL["function"]["parameters"]}
    two = chat(tools=[TOOL, {"type": "function", "function": {"name": "g"}}], tool_choice="required")
    tag = chat_guided(two.tools, two.tool_choice, None, LLAMA3_JSON).structural_tag
    assert tag["format"]["type"] == "or"
    assert [e["elements"][0]["json_schema"]["properties"]["name"] for e in tag["format"]["elements"]] == \
        [{"const": "f"}, {"const": "g"}]
    assert "parameters" in tag["format"]["elements"][1]["elements"][0]["json_schema"]["properties"]
    auto = chat(tools=[TOOL])
    assert chat_guided(auto.tools, auto.tool_choice, auto.response_format, HERMES) is None
    fmt = chat(response_format={"type": "json_object"})
    assert chat_guided(fmt.tools, fmt.tool_choice, fmt.response_format, LLAMA3_JSON).json_object


def test_unenforceable_parameters_are_a_400() -> None:
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}
    with pytest.raises(InvalidRequestError) as info:
        chat(tools=[bad])
    assert info.value.param == "tools" and "'not' at #" in str(info.value)
    with pytest.raises(InvalidRequestError, match="unique"):
        chat(tools=[TOOL, TOOL])


def test_a_call_nested_past_the_json_decoders_stack_is_read_as_text_not_a_crash() -> None:
    text = '<tool_call>{"arguments": ' + "[" * 100_000 + "]" * 100_000 + ', "name": "f"}</tool_call>'
    assert HERMES.parse(text) == (text, [])  # was RecursionError: a 500


class Address(BaseModel):
    city: str
    zip: str


class Person(BaseModel):  # pydantic writes the nested models as $defs and $ref
    name: str
    home: Address
    friends: list[Person] = []


PERSON_TOOL = {"type": "function", "function": {"name": "add", "parameters": Person.model_json_schema()}}


@pytest.fixture(scope="module")
def compiler(tmp_path_factory: pytest.TempPathFactory) -> GuidedCompiler:
    tok = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("tools"), "llama"))
    return GuidedCompiler(tok, 300, [0])


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
@pytest.mark.parametrize("template", ["<tool_call>", "llama", "[TOOL_CALLS]"])
def test_forced_calls_of_tools_with_defs_and_refs_compile_and_match_their_calls(
        compiler: GuidedCompiler, choice: object, template: str) -> None:
    """400 "Cannot find field '$defs'" before: the parameters sat under the call's `arguments`, where their
    `#/$defs/...` references no longer resolved; the same schema worked as response_format."""
    assert "$defs" in PERSON_TOOL["function"]["parameters"]
    req = chat(tools=[PERSON_TOOL, TOOL], tool_choice=choice)
    fmt = tool_call_format(template)
    compiled = compiler.compile(chat_guided(req.tools, req.tool_choice, None, fmt))
    args = {"name": "Ada", "home": {"city": "Paris", "zip": "75001"}, "friends": [
        {"name": "Bob", "home": {"city": "Rome", "zip": "00100"}, "friends": []}]}
    call = json.dumps({"name": "add", fmt.args_key: args}, separators=(", ", ": "))
    for text, ok in ((call, True), (call.replace('"zip": "00100"', '"zip": 100'), False)):
        body = {"<tool_call>": f"<tool_call>\n{text}\n</tool_call>", "[TOOL_CALLS]": f"[TOOL_CALLS][{text}]"}
        matcher = xgr.GrammarMatcher(compiled)
        assert (matcher.accept_string(body.get(template, text)) and matcher.is_completed()) is ok, text
    assert PERSON_TOOL["function"]["parameters"] == Person.model_json_schema()  # the request's schema is untouched


def test_references_outside_the_definitions_follow_the_parameters() -> None:
    recursive = {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
                 "required": ["next"]}
    req = chat(tools=[{"type": "function", "function": {"name": "f", "parameters": recursive}}], tool_choice="required")
    tag = chat_guided(req.tools, req.tool_choice, None, LLAMA3_JSON).structural_tag
    body = tag["format"]["elements"][0]["json_schema"]  # llama's calls hold their arguments as "parameters"
    assert body["properties"]["parameters"]["properties"]["next"]["anyOf"][0] == {"$ref": "#/properties/parameters"}
    build_grammar(chat_guided(req.tools, req.tool_choice, None, LLAMA3_JSON))  # resolves


SMOLLM2_TEXT = ('Sure. <tool_call>[\n{"name": "f", "arguments": {"x": 1}},\n{"name": "g", "arguments": {}}\n]'
                '</tool_call>')


def test_smollm2_calls_are_a_list_between_tags() -> None:
    content, calls = SMOLLM2.parse(SMOLLM2_TEXT)
    assert content == "Sure." and [(c.name, c.arguments) for c in calls] == [("f", '{"x": 1}'), ("g", "{}")]
    assert SMOLLM2.parse("<tool_call>[]</tool_call>") == ("", [])  # an empty list: no call
    assert SMOLLM2.parse("[TOOL_CALLS][]") == ("[TOOL_CALLS][]", [])  # another format's markup is text
    cut = SMOLLM2.parse('<tool_call>[{"name": "f", "arguments": {"x": 1}}]</tool_')  # cut in the closing tag
    assert cut[0] is None and [(c.name, c.arguments) for c in cut[1]] == [("f", '{"x": 1}')]


def test_smollm2_calls_stream_as_openai_deltas() -> None:
    """Character by character: the same calls as the whole text, and neither the tags nor the list in content."""
    content, calls, _ = merged(SMOLLM2, SMOLLM2_TEXT + " Done.", 1)
    assert content == "Sure. Done."
    assert [(c["name"], c["arguments"]) for c in calls] == [("f", '{"x": 1}'), ("g", "{}")]
