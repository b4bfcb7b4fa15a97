"""The Responses API end to end on the demo model: the official openai SDK (create, stream, parse, function
tools, retrieve, delete), LangChain's ChatOpenAI(use_responses_api=True) and the OpenAI Agents SDK.

Greedy decoding throughout, so a response must say exactly what the chat route says for the same messages
(one engine path), and its usage must count the tokens the tokenizer gives for the rendered template. The
demo model writes Python-shaped text: "def add(a, b):" ends by itself within 200 tokens, "hello" does not.
Function calls are forced with tool_choice, and JSON bounded by its schema, so both end by themselves.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from runtime.demo import demo_model_path
from runtime.tokenizer import Tokenizer
from tests.e2e.conftest import RunningServer, launch

MODEL = "demo"
ENDS = "def add(a, b):"  # greedy: ends with EOS after about 110 tokens
GOES_ON = "hello"
TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}},
                         "required": ["city"], "additionalProperties": False}}]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}} for tool in TOOLS]
TEXT_OPEN = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
TEXT_CLOSE = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


class Pet(BaseModel):
    name: str = Field(max_length=8)
    species: Literal["cat", "dog", "fish"]
    age: int = Field(ge=0, le=30)


def serve(**gateway: Any) -> RunningServer:
    # tool prompts are long in the demo model's 4k vocabulary
    return launch(Path(demo_model_path()), "native", gateway=gateway, served_model_name=MODEL, max_num_tokens=2048,
                  max_kv_tokens=16384)


@pytest.fixture(scope="module")
def demo() -> Iterator[RunningServer]:
    srv = serve()
    yield srv
    srv.stop()


@pytest.fixture
def client(demo: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=demo.base_url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_pretrained(demo_model_path())


def prompt_tokens(tok: Tokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
    return len(tok.encode(tok.apply_chat_template(messages, tools=tools), add_special_tokens=False))


def chat(client: openai.OpenAI, messages: list[dict[str, Any]], max_tokens: int, **kw: Any) -> Any:
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0, **kw)


# ----- create -----

@pytest.mark.parametrize(("text", "limit", "status"), [(ENDS, 200, "completed"), (GOES_ON, 12, "incomplete")])
def test_string_input_answers_as_chat_does(client: openai.OpenAI, tok: Tokenizer, text: str, limit: int,
                                           status: str) -> None:
    r = client.responses.create(model=MODEL, input=text, max_output_tokens=limit, temperature=0)
    messages = [{"role": "user", "content": text}]
    c = chat(client, messages, limit)
    assert r.status == status and r.object == "response" and r.model == MODEL
    (message,) = r.output
    assert message.type == "message" and message.role == "assistant" and message.status == status
    assert r.output_text == c.choices[0].message.content and r.output_text
    assert c.choices[0].finish_reason == ("stop" if status == "completed" else "length")
    n = prompt_tokens(tok, messages)
    u = r.usage
    assert (u.input_tokens, u.output_tokens, u.total_tokens) == (n, c.usage.completion_tokens, n + u.output_tokens)
    assert c.usage.prompt_tokens == n and u.output_tokens_details.reasoning_tokens == 0
    assert 0 <= u.input_tokens_details.cached_tokens <= n
    if status == "completed":
        assert u.output_tokens < limit and r.incomplete_details is None
    else:  # max_output_tokens hit
        assert u.output_tokens == limit and r.incomplete_details.reason == "max_output_tokens"


def test_message_list_with_instructions_and_replayed_output(client: openai.OpenAI, tok: Tokenizer) -> None:
    r = client.responses.create(model=MODEL, instructions="You write Python.", max_output_tokens=16, temperature=0,
                                input=[{"role": "developer", "content": "Short functions only."},
                                       {"role": "user", "content": [{"type": "input_text", "text": "def add(a, b):"}]},
                                       {"type": "message", "role": "assistant", "content": [
                                           {"type": "output_text", "text": "    return a + b", "annotations": []}]},
                                       {"role": "user", "content": "def sub(a, b):"}])
    messages = [{"role": "system", "content": "You write Python."},
                {"role": "developer", "content": "Short functions only."},
                {"role": "user", "content": "def add(a, b):"}, {"role": "assistant", "content": "    return a + b"},
                {"role": "user", "content": "def sub(a, b):"}]
    c = chat(client, messages, 16)
    assert r.output_text == c.choices[0].message.content and r.usage.input_tokens == c.usage.prompt_tokens
    assert r.instructions == "You write Python."
    assert r.usage.input_tokens == prompt_tokens(tok, [{**m, "role": "system"} if m["role"] == "developer" else m
                                                       for m in messages])


# ----- streaming -----

def test_stream_sends_the_typed_events_of_the_text(client: openai.OpenAI) -> None:
    with client.responses.stream(model=MODEL, input=ENDS, max_output_tokens=200, temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert types == [*TEXT_OPEN, *["response.output_text.delta"] * len(deltas), *TEXT_CLOSE, "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert len({e.response.id for e in events if hasattr(e, "response")}) == 1
    done = events[-4]
    assert "".join(deltas) == done.text == final.output_text
    whole = client.responses.create(model=MODEL, input=ENDS, max_output_tokens=200, temperature=0)
    assert final.output_text == whole.output_text and final.status == whole.status == "completed"
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_stream_cut_by_max_output_tokens_ends_incomplete(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model=MODEL, input=GOES_ON, max_output_tokens=5, temperature=0,
                                          stream=True))
    assert [e.type for e in events[-4:]] == [*TEXT_CLOSE, "response.incomplete"]
    last = events[-1].response
    assert last.status == "incomplete" and last.incomplete_details.reason == "max_output_tokens"
    assert last.usage.output_tokens == 5 and last.output[0].status == "incomplete"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == last.output_text


# ----- structured output and tools -----

def test_parse_returns_the_pydantic_object(client: openai.OpenAI) -> None:
    r = client.responses.parse(model=MODEL, input="Describe a pet.", text_format=Pet, max_output_tokens=200,
                               temperature=0)
    assert r.status == "completed" and isinstance(r.output_parsed, Pet)
    assert r.output_parsed == Pet.model_validate_json(r.output_text)
    assert r.text.format.type == "json_schema" and r.text.format.name == "Pet"


def test_function_tool_round_trip(client: openai.OpenAI, tok: Tokenizer) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r1 = client.responses.create(model=MODEL, input=ask, tools=TOOLS, tool_choice="required", temperature=0,
                                 max_output_tokens=100)
    (call,) = r1.output
    assert r1.status == "completed" and call.type == "function_call" and call.name == "get_weather"
    assert set(json.loads(call.arguments)) == {"city"} and call.call_id.startswith("call_")
    # the call's output goes back; the earlier input and the call come from the stored response
    r2 = client.responses.create(model=MODEL, previous_response_id=r1.id, tools=TOOLS, temperature=0,
                                 max_output_tokens=24, input=[{"type": "function_call_output", "call_id": call.call_id,
                                                               "output": "sunny, 21 C"}])
    messages = [*ask, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny, 21 C"}]
    c = chat(client, messages, 24, tools=CHAT_TOOLS).choices[0].message
    assert r2.previous_response_id == r1.id and r2.output_text == (c.content or "")
    assert [(i.name, i.arguments) for i in r2.output if i.type == "function_call"] == \
        [(t.function.name, t.function.arguments) for t in c.tool_calls or []]
    assert r2.usage.input_tokens == prompt_tokens(tok, messages, CHAT_TOOLS)


def test_named_function_call_streams_its_arguments(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model=MODEL, input="Weather in Rome?", tools=TOOLS, temperature=0,
                                          tool_choice={"type": "function", "name": "get_weather"},
                                          max_output_tokens=100, stream=True))
    fragments = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert [e.type for e in events] == ["response.created", "response.in_progress", "response.output_item.added",
                                        *["response.function_call_arguments.delta"] * len(fragments),
                                        "response.function_call_arguments.done", "response.output_item.done",
                                        "response.completed"]
    added, done, item_done, completed = events[2], events[-3], events[-2], events[-1]
    assert added.item.type == "function_call" and added.item.arguments == "" and added.item.status == "in_progress"
    assert added.item.name == "get_weather" and len(fragments) > 1  # the arguments stream as they are written
    (call,) = completed.response.output
    assert "".join(fragments) == done.arguments == item_done.item.arguments == call.arguments
    assert done.item_id == added.item.id == call.id and call.status == "completed"
    assert set(json.loads(call.arguments)) == {"city"}


# ----- the store -----

def test_retrieve_and_delete(client: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL, input=GOES_ON, max_output_tokens=4, temperature=0,
                                metadata={"topic": "greeting"})
    assert client.responses.retrieve(r.id).model_dump() == r.model_dump()
    assert client.responses.delete(r.id) is None  # the SDK returns nothing; the body says deleted
    for call in (client.responses.retrieve, client.responses.delete):
        with pytest.raises(openai.NotFoundError) as err:
            call(r.id)
        assert err.value.status_code == 404 and err.value.body["message"] == f"Response with id '{r.id}' not found."


def test_input_items_list_the_conversation_in_pages(client: openai.OpenAI, demo: RunningServer) -> None:
    """OpenAI's list: the items the response was generated from (the earlier response's input and output, then its
    own input), newest first by default, `limit` and `after` paging through them with stable ids."""
    r1 = client.responses.create(model=MODEL, input=GOES_ON, max_output_tokens=2, temperature=0)
    r2 = client.responses.create(model=MODEL, previous_response_id=r1.id, max_output_tokens=2, temperature=0,
                                 input=[{"role": "user", "content": [{"type": "input_text", "text": "more"}]}])
    page = client.responses.input_items.list(r2.id, order="asc")
    assert [(i.type, i.role) for i in page.data] == [("message", "user"), ("message", "assistant"),
                                                    ("message", "user")]
    assert [i.content[0].text for i in page.data] == [GOES_ON, r1.output_text, "more"]
    assert page.data[1].id == r1.output[0].id and page.data[1].content[0].type == "output_text"
    assert page.data[0].content[0].type == "input_text" and page.has_more is False
    assert (page.first_id, page.last_id) == (page.data[0].id, page.data[-1].id)
    newest_first = client.responses.input_items.list(r2.id)
    assert [i.id for i in newest_first.data] == [i.id for i in reversed(page.data)]
    one = client.responses.input_items.list(r2.id, order="asc", limit=1)
    assert [i.id for i in one.data] == [page.data[0].id] and one.has_more is True
    assert [i.id for i in client.responses.input_items.list(r2.id, order="asc", limit=1, after=one.last_id).data] \
        == [page.data[1].id]
    assert [i.id for i in client.responses.input_items.list(r2.id, order="asc", limit=1)] == [i.id for i in page.data]
    assert [i.id for i in client.responses.input_items.list(r1.id).data] == [page.data[0].id]  # the same ids
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_missing")
    for query, param in (({"limit": 0}, "limit"), ({"order": "up"}, "order"), ({"after": "msg_x"}, "after")):
        r = httpx.get(f"{demo.base_url}/responses/{r2.id}/input_items", params=query)
        assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_unstored_responses_cannot_be_retrieved_or_continued(client: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL, input=GOES_ON, max_output_tokens=2, temperature=0, store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model=MODEL, input="more", previous_response_id=r.id)
    assert err.value.param == "previous_response_id"


def test_store_size_drops_the_oldest() -> None:
    srv = serve(responses_store_size=2)
    try:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        ids = [client.responses.create(model=MODEL, input=GOES_ON, max_output_tokens=1).id for _ in range(3)]
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(ids[0])
        assert [client.responses.retrieve(i).id for i in ids[1:]] == ids[1:]
    finally:
        srv.stop()


# ----- errors -----

@pytest.mark.parametrize(("fields", "param"), [
    ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"background": True}, "background"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
     "input[0].content[0]"),
])
def test_what_we_cannot_honour_is_a_400_naming_it(client: openai.OpenAI, fields: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, **{"input": "hi", **fields})
    assert err.value.param == param and err.value.code == "unsupported_parameter"


def test_bad_input_is_a_400_naming_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input=[{"type": "function_call_output", "output": "x"}])
    assert err.value.param == "input[0]" and "call_id" in err.value.message


def test_unknown_fields_are_named_in_a_header(client: openai.OpenAI) -> None:
    raw = client.responses.with_raw_response.create(model=MODEL, input=GOES_ON, max_output_tokens=1,
                                                    extra_body={"foo": 1})
    assert raw.headers["x-ignored-fields"] == "foo" and raw.parse().status == "incomplete"


# ----- LangChain and the Agents SDK -----

def test_langchain_chat_openai_on_the_responses_api(demo: RunningServer, client: openai.OpenAI) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=demo.base_url, api_key="unused", model=MODEL, temperature=0, max_tokens=8,
                     max_retries=0, use_responses_api=True)
    reply = llm.invoke(GOES_ON)
    direct = client.responses.create(model=MODEL, input=GOES_ON, max_output_tokens=8, temperature=0)
    assert reply.text == direct.output_text and reply.text
    assert reply.usage_metadata["output_tokens"] == 8 and reply.usage_metadata["input_tokens"] == \
        direct.usage.input_tokens
    assert reply.response_metadata["status"] == "incomplete"
    assert client.responses.retrieve(reply.response_metadata["id"]).output_text == reply.text
    assert "".join(chunk.text for chunk in llm.stream(GOES_ON)) == reply.text


class Report(BaseModel):
    city: str = Field(max_length=10)
    sunny: bool


async def test_agents_sdk_runs_a_one_tool_agent(demo: RunningServer) -> None:
    """The first turn is forced to call the tool (the SDK then resets tool_choice); the second sends the call and
    its output back and answers with the output type's JSON."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        cities.append(city)
        return "sunny"

    model = OpenAIResponsesModel(model=MODEL, openai_client=openai.AsyncOpenAI(base_url=demo.base_url,
                                                                               api_key="unused", max_retries=0))
    agent = Agent(name="weather", instructions="Answer about the weather.", tools=[get_weather], model=model,
                  output_type=Report, model_settings=ModelSettings(tool_choice="required", temperature=0,
                                                                   max_tokens=200))
    result = await Runner.run(agent, "What is the weather in Paris?", max_turns=3)
    assert len(cities) == 1 and isinstance(result.final_output, Report)
    assert [type(item).__name__ for item in result.new_items] == ["ToolCallItem", "ToolCallOutputItem",
                                                                  "MessageOutputItem"]
    first, second = result.raw_responses
    assert [item.type for item in first.output] == ["function_call"]
    assert json.loads(first.output[0].arguments) == {"city": cities[0]}
    assert [item.type for item in second.output] == ["message"]
    assert Report.model_validate_json(second.output[0].content[0].text) == result.final_output
