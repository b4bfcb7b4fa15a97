"""Tools end to end: the template renders them, forced calls validate, calls come back as tool_calls.

Two tiny random models: one with the demo model's Hermes template (`<tool_call>` tags), one with a
Llama 3 style template (a bare JSON call). Forced calls (tool_choice "required" or a named function)
are grammar-constrained, so even a random model returns arguments matching the schema.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import httpx
import openai
import pytest
from langchain_core.messages import AIMessage
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field
from transformers import AutoTokenizer

from runtime.demo import demo_model_path
from tests.e2e.conftest import MODEL_NAME, RunningServer, launch
from tests.tiny_models import build_tiny_model

HERMES_TEMPLATE = (Path(demo_model_path()).parent / "chat_template.jinja").read_text()
# Llama 3.1's convention in miniature: tools as JSON in the user turn, the call as a bare JSON object.
LLAMA3_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if tools and loop.last and m.role == 'user' %}Respond with a JSON function call "
    '{"name": function name, "parameters": {...}}. Functions:\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}'
    "{% endif %}{{ m.content or '' }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class GetWeather(BaseModel):
    """Current weather in a city."""

    city: str = Field(max_length=10)
    unit: Literal["celsius", "fahrenheit"]
    days: int = Field(ge=1, le=7)


class Lookup(BaseModel):
    """Look a word up."""

    word: str = Field(max_length=6)


TOOLS = [{"type": "function", "function": {"name": name, "description": model.__doc__,
                                           "parameters": model.model_json_schema()}}
         for name, model in (("get_weather", GetWeather), ("lookup", Lookup))]
SCHEMAS = {"get_weather": GetWeather, "lookup": Lookup}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


def model_with_template(root: Path, template: str, name: str) -> Path:
    """The tiny model with a longer context (tool prompts are long in a byte-level vocabulary) and `template`."""
    src = build_tiny_model(root, "llama", max_position_embeddings=2048)
    dst = root / name
    shutil.copytree(src, dst)
    tok = AutoTokenizer.from_pretrained(dst)
    tok.chat_template = template
    tok.save_pretrained(dst)
    return dst


def serve(path: Path) -> RunningServer:
    return launch(path, "native", max_num_tokens=2048, max_kv_tokens=16384)


@pytest.fixture(scope="module")
def hermes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = serve(model_with_template(tmp_path_factory.mktemp("tools"), HERMES_TEMPLATE, "hermes"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def llama3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = serve(model_with_template(tmp_path_factory.mktemp("tools"), LLAMA3_TEMPLATE, "llama3"))
    yield srv
    srv.stop()


def client(srv: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)


def check_calls(calls: list, allowed: set[str]) -> None:
    assert len(calls) == 1
    call = calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in allowed
    SCHEMAS[call.function.name].model_validate_json(call.function.arguments)


@pytest.mark.parametrize("template", ["hermes", "llama3"])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "lookup"}}])
def test_forced_call_validates(request: pytest.FixtureRequest, template: str, choice) -> None:
    srv = request.getfixturevalue(template)
    reply = client(srv).chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS,
                                                tool_choice=choice, temperature=1.0, seed=5, max_tokens=200)
    message = reply.choices[0].message
    check_calls(message.tool_calls, {"lookup"} if isinstance(choice, dict) else set(SCHEMAS))
    assert message.content is None
    assert reply.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_call_streams_as_tool_call_deltas(hermes: RunningServer, choice) -> None:
    stream = client(hermes).chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS,
                                                    tool_choice=choice, temperature=0.0, max_tokens=200, stream=True)
    chunks = [c for c in stream if c.choices]
    deltas = [c.choices[0].delta for c in chunks]
    assert not any(d.content for d in deltas)  # the <tool_call> text never leaks as content
    entries = [tc for d in deltas for tc in d.tool_calls or []]
    assert {tc.index for tc in entries} == {0}
    first, rest = entries[0], entries[1:]
    assert first.id and first.function.name and first.function.arguments == ""  # names the call, as OpenAI's
    assert len(rest) > 2 and all(tc.id is None and tc.function.name is None for tc in rest)  # then fragments
    first.function.arguments = "".join(tc.function.arguments for tc in rest)
    check_calls([first], {"get_weather"} if isinstance(choice, dict) else set(SCHEMAS))
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # the same greedy call, not streamed
    whole = client(hermes).chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS,
                                                   tool_choice=choice, temperature=0.0, max_tokens=200)
    same = whole.choices[0].message.tool_calls[0]
    assert (same.function.name, same.function.arguments) == (first.function.name, first.function.arguments)


CUT_ARGS = dict(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, temperature=0.0,
                tool_choice={"type": "function", "function": {"name": "get_weather"}})


@pytest.fixture(scope="module")
def cut_budget(hermes: RunningServer) -> tuple[str, int]:
    """(the greedy forced call's full arguments, the longest max_tokens whose cut ends inside them): searched once
    for both the streamed and the non-streamed test (greedy: the same for both)."""
    full = client(hermes).chat.completions.create(**CUT_ARGS, max_tokens=200)
    full_text = full.choices[0].message.tool_calls[0].function.arguments
    # the longest cut that ends inside the arguments (the closing brace and tag are a few tokens)
    budget = full.usage.completion_tokens - 1
    while (tc := client(hermes).chat.completions.create(**CUT_ARGS, max_tokens=budget).choices[0].message.tool_calls) \
            and tc[0].function.arguments == full_text:
        budget -= 1
    return full_text, budget


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_call_cut_by_max_tokens_is_an_incomplete_call(hermes: RunningServer, cut_budget: tuple[str, int],
                                                               stream: bool) -> None:
    """Never `<tool_call>` markup in content: the call so far, finish_reason "length"."""
    full_text, budget = cut_budget
    cut = client(hermes).chat.completions.create(**CUT_ARGS, stream=stream, max_tokens=budget)
    if stream:
        chunks = [c for c in cut if c.choices]
        content = "".join(c.choices[0].delta.content or "" for c in chunks)
        entries = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or []]
        name, partial = entries[0].function.name, "".join(tc.function.arguments or "" for tc in entries)
        finish = chunks[-1].choices[0].finish_reason
    else:
        message = cut.choices[0].message
        content, finish = message.content, cut.choices[0].finish_reason
        (call,) = message.tool_calls
        name, partial = call.function.name, call.function.arguments
    assert not content and finish == "length"
    assert name == "get_weather" and partial and full_text.startswith(partial) and partial != full_text


def test_sdk_parse_with_strict_pydantic_tools(hermes: RunningServer) -> None:
    tools = [openai.pydantic_function_tool(GetWeather), openai.pydantic_function_tool(Lookup)]  # strict schemas
    reply = client(hermes).chat.completions.parse(model=MODEL_NAME, messages=MESSAGES, tools=tools,
                                                  tool_choice="required", temperature=1.0, seed=2, max_tokens=200)
    call = reply.choices[0].message.tool_calls[0]
    assert isinstance(call.function.parsed_arguments, {"GetWeather": GetWeather, "Lookup": Lookup}[call.function.name])
    assert reply.choices[0].finish_reason == "tool_calls"


def test_tools_are_rendered_by_the_chat_template(hermes: RunningServer) -> None:
    tok = AutoTokenizer.from_pretrained(hermes.settings.engine.model)
    for choice, rendered in (("auto", TOOLS), ("none", None)):
        reply = client(hermes).chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS,
                                                       tool_choice=choice, max_tokens=1)
        expected = tok.apply_chat_template(MESSAGES, tools=rendered, add_generation_prompt=True, tokenize=False)
        assert reply.usage.prompt_tokens == len(tok.encode(expected, add_special_tokens=False))
    assert "<tools>" in tok.apply_chat_template(MESSAGES, tools=TOOLS, tokenize=False)


def test_a_conversation_with_tool_calls_and_results_is_accepted(hermes: RunningServer) -> None:
    messages = [*MESSAGES,
                {"role": "assistant", "content": None, "tool_calls": [{
                    "id": "call_1", "type": "function",
                    "function": {"name": "get_weather",
                                 "arguments": '{"city": "Paris", "unit": "celsius", "days": 1}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees"}]
    reply = client(hermes).chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS,
                                                   tool_choice="required", temperature=0.0, max_tokens=200)
    check_calls(reply.choices[0].message.tool_calls, set(SCHEMAS))


def test_bad_tool_choice_is_a_400(hermes: RunningServer) -> None:
    for body, message in (
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice names function 'nope', which is not in tools (get_weather, lookup)"),
        ({"tool_choice": "required"}, "tool_choice 'required' needs at least one tool"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
         "response_format cannot be combined with a forced tool_choice ('required' or a named function)"),
    ):
        r = httpx.post(f"{hermes.url}/v1/chat/completions", json={"model": MODEL_NAME, "messages": MESSAGES, **body})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["message"] == message


@pytest.mark.parametrize("tool_choice", ["any", "Lookup"])
def test_langchain_bind_tools_yields_tool_calls(hermes: RunningServer, tool_choice: str) -> None:
    llm = ChatOpenAI(base_url=hermes.base_url, api_key="unused", model=MODEL_NAME, temperature=0, max_tokens=200,
                     max_retries=0)
    bound = llm.bind_tools([GetWeather, Lookup], tool_choice=tool_choice)
    reply = bound.invoke("Weather in Paris?")
    assert isinstance(reply, AIMessage) and len(reply.tool_calls) == 1
    call = reply.tool_calls[0]
    assert call["name"] in ({"Lookup"} if tool_choice == "Lookup" else {"GetWeather", "Lookup"})
    {"GetWeather": GetWeather, "Lookup": Lookup}[call["name"]].model_validate(call["args"])
    streamed = None
    for chunk in bound.stream("Weather in Paris?"):
        streamed = chunk if streamed is None else streamed + chunk
    assert [(c["name"], c["args"]) for c in streamed.tool_calls] == [(call["name"], call["args"])]


class Place(BaseModel):
    city: str = Field(max_length=6)


class Trip(BaseModel):
    """Plan a trip: pydantic writes the nested models as $defs and $ref."""

    start: Place
    stops: list[Place] = Field(max_length=2)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "Trip"}}])
def test_a_tool_with_defs_and_refs_can_be_forced_on_chat_and_responses(hermes: RunningServer, choice) -> None:
    """Both were 400 "Cannot find field '$defs'" (the same schema worked as response_format)."""
    tool = openai.pydantic_function_tool(Trip)
    assert "$defs" in tool["function"]["parameters"]
    reply = client(hermes).chat.completions.parse(model=MODEL_NAME, messages=MESSAGES, tools=[tool],
                                                  tool_choice=choice, temperature=1.0, seed=3, max_tokens=300)
    assert isinstance(reply.choices[0].message.tool_calls[0].function.parsed_arguments, Trip)
    flat = {"type": "function", "name": "Trip", "parameters": tool["function"]["parameters"], "strict": True}
    named = {"type": "function", "name": "Trip"} if isinstance(choice, dict) else choice
    response = client(hermes).responses.create(model=MODEL_NAME, input="Plan it", tools=[flat], tool_choice=named,
                                               temperature=1.0, extra_body={"seed": 3}, max_output_tokens=300)
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "Trip" and Trip.model_validate_json(call.arguments)
