"""The Responses API: request parsing and translation to the chat path, the stream events, the store, and
the routes over a scripted engine (tests/e2e/test_openai_responses.py drives a real server with real clients)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import openai.types.responses as sdk
import pytest
from starlette.testclient import TestClient

from adapters.openai.requests import ChatCompletionRequest, UnsupportedFieldError
from adapters.openai.responses_input import chat_completion_request, output_items, responses_request
from adapters.openai.responses_objects import ResponseStreamEvent
from adapters.openai.responses_output import ResponsesOutput
from adapters.openai.responses_request import ResponsesRequest
from adapters.openai.translate import chat_messages, chat_request
from adapters.openai.validation import parse_request
from gateway.app import create_app
from gateway.cli import parse_serve_args
from gateway.errors import openai_error_body
from gateway.response_store import ResponseStore, StoredResponse
from gateway.settings import Settings
from runtime.demo import demo_model_path
from runtime.errors import EngineFailedError, InvalidRequestError
from runtime.request import OutputDelta, Usage
from runtime.tokenizer import Tokenizer
from tests.unit.test_gateway_app import ScriptedEngine, sse_data

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
# The SDK's typed model of each event we send: every event must parse as the one its type names.
SDK_EVENTS = {
    "response.created": sdk.ResponseCreatedEvent, "response.in_progress": sdk.ResponseInProgressEvent,
    "response.output_item.added": sdk.ResponseOutputItemAddedEvent,
    "response.content_part.added": sdk.ResponseContentPartAddedEvent,
    "response.output_text.delta": sdk.ResponseTextDeltaEvent, "response.output_text.done": sdk.ResponseTextDoneEvent,
    "response.content_part.done": sdk.ResponseContentPartDoneEvent,
    "response.output_item.done": sdk.ResponseOutputItemDoneEvent,
    "response.function_call_arguments.delta": sdk.ResponseFunctionCallArgumentsDeltaEvent,
    "response.function_call_arguments.done": sdk.ResponseFunctionCallArgumentsDoneEvent,
    "response.completed": sdk.ResponseCompletedEvent, "response.incomplete": sdk.ResponseIncompleteEvent,
    "response.failed": sdk.ResponseFailedEvent, "error": sdk.ResponseErrorEvent,
}
TEXT_EVENTS = ["response.output_item.added", "response.content_part.added"]
TEXT_CLOSE = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


def parse(**body: Any) -> ResponsesRequest:
    return parse_request(ResponsesRequest, body)


@pytest.fixture(scope="module")
def demo_tokenizer() -> Tokenizer:
    """The demo model's tokenizer: its template renders tools and writes calls in Hermes tags."""
    return Tokenizer.from_pretrained(demo_model_path())


# ----- input -> chat -----

def test_string_input_is_one_user_message_after_the_instructions() -> None:
    chat = chat_completion_request(req := parse(input="hi", instructions="Be brief."), req.input)
    assert chat_messages(chat) == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]


def test_items_become_chat_messages() -> None:
    """Parts join with newlines (as chat's do); assistant output is replayed; a call joins the assistant turn
    it followed, parallel calls share it; a call's output is a tool message."""
    req = parse(input=[
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "a"},
                                                             {"type": "input_text", "text": "b"}]},
        {"role": "user", "content": "weather?"},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Looking.", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"P"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city":"R"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
        {"type": "function_call", "call_id": "c3", "name": "get_weather", "arguments": "{}"},
    ])
    call = lambda i, city: {"id": f"c{i}", "type": "function",  # noqa: E731
                            "function": {"name": "get_weather", "arguments": city}}
    assert chat_messages(chat_completion_request(req, req.input)) == [
        {"role": "system", "content": "a\nb"},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [call(1, '{"city":"P"}'), call(2, '{"city":"R"}')]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
        {"role": "assistant", "content": "", "tool_calls": [call(3, "{}")]},
    ]


def test_engine_request_is_the_chat_request_of_the_same_messages(demo_tokenizer: Tokenizer) -> None:
    """Same prompt (tools rendered), sampling and grammar as chat: the same tokens on both routes."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    req = parse(input=[{"role": "user", "content": "hi"}], instructions="sys", max_output_tokens=7, temperature=0.5,
                top_p=0.9, top_k=3, seed=1, tools=[WEATHER], parallel_tool_calls=False,
                text={"format": {"type": "json_schema", "name": "obj", "schema": schema, "strict": True}})
    chat = ChatCompletionRequest.model_validate({
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
        "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 3, "seed": 1,
        "parallel_tool_calls": False,
        "tools": [{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "obj", "schema": schema, "strict": True}}})
    ours = responses_request(req, req.input, "resp-1", demo_tokenizer)
    theirs = chat_request(chat, "resp-1", demo_tokenizer)
    assert "get_weather" in ours.prompt and ours.prompt == theirs.prompt
    assert ours.sampling == theirs.sampling and ours.sampling.max_tokens == 7
    assert ours.guided.json_schema == schema and ours.guided.param == "text.format"


def test_text_formats_and_forced_calls(demo_tokenizer: Tokenizer) -> None:
    req = parse(input="x", text={"format": {"type": "json_object"}})
    assert responses_request(req, req.input, "r", demo_tokenizer).guided.json_object is True
    req = parse(input="x", text={"format": {"type": "text"}})
    assert responses_request(req, req.input, "r", demo_tokenizer).guided is None
    # A forced call is constrained to the call: the format (for text) has nothing to apply to.
    for choice in ("required", {"type": "function", "name": "get_weather"}):
        req = parse(input="x", tools=[WEATHER], tool_choice=choice, text={"format": {"type": "json_object"}})
        guided = responses_request(req, req.input, "r", demo_tokenizer).guided
        assert guided.structural_tag is not None and guided.param == "tools"


@pytest.mark.parametrize(("body", "param", "unsupported"), [
    ({"input": []}, "input", False),
    ({"input": [{"role": "user"}]}, "input[0]", False),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0]", False),
    ({"input": [{"role": "user", "content": 5}]}, "input[0].content", False),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0]", True),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]",
     True),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_file"}]}]},
     "input[0].output[0]", True),
    ({"input": "x", "tools": [WEATHER, {"type": "web_search"}]}, "tools[1]", True),
    ({"input": "x", "tool_choice": {"type": "file_search"}}, "tool_choice", True),
    ({"input": "x", "tool_choice": "required"}, "tool_choice", False),
    ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", False),
    ({"input": "x", "background": True}, "background", True),
    ({"input": "x", "reasoning": {"effort": "high"}}, "reasoning", True),
    ({"input": "x", "conversation": "conv_1"}, "conversation", True),
    ({"input": "x", "truncation": "auto"}, "truncation", True),
    ({"input": "x", "include": ["message.output_text.logprobs"]}, "include", True),
    ({"input": "x", "text": {"verbosity": "low"}}, "text.verbosity", True),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format", False),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"not": {}}}}}, "text.format",
     False),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", False),
    ({"input": "x", "temperature": 3}, "temperature", False),
])
def test_bad_input_is_400_naming_the_param(body: dict[str, Any], param: str, unsupported: bool) -> None:
    with pytest.raises(InvalidRequestError) as err:
        parse_request(ResponsesRequest, body)
    assert err.value.param == param
    assert isinstance(err.value, UnsupportedFieldError) == unsupported
    assert openai_error_body(err.value)["error"]["code"] == ("unsupported_parameter" if unsupported else None)


def test_default_values_of_unsupported_fields_are_accepted() -> None:
    req = parse(input="x", background=False, reasoning={"effort": None, "summary": None}, truncation="disabled",
                include=["reasoning.encrypted_content"], top_logprobs=0, n=1, stream_options={"include_obfuscation": 1})
    assert req.background is False and req.store is True


# ----- deltas -> events -----

def delta(text: str, finish: str | None = None, prompt: int = 5, generated: int = 0) -> tuple[int, OutputDelta]:
    d = OutputDelta("r", 0, [1], text, finish_reason=finish)
    if finish is not None:
        d.usage = Usage(prompt_tokens=prompt, completion_tokens=generated, cached_tokens=2)
    return 0, d


def stream(output: ResponsesOutput, items: list[tuple[int, OutputDelta]]) -> list[dict[str, Any]]:
    events = [e for item in items for e in output.chunks(item)] + output.final_chunks()
    for event in events:
        SDK_EVENTS[event["type"]].model_validate(event)
        ResponseStreamEvent.model_validate(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def without_ids(response: dict[str, Any]) -> dict[str, Any]:
    return {**response, "output": [{**item, "id": None} for item in response["output"]], "completed_at": None}


def test_text_stream_events_and_the_same_response_without_stream(demo_tokenizer: Tokenizer) -> None:
    req = parse(input="hi", max_output_tokens=9, metadata={"k": "v"})
    items = [delta("Hel"), delta(""), delta("lo", "stop", generated=3)]
    events = stream(ResponsesOutput(req, "resp-1", "demo", demo_tokenizer, created=7), items)
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", *TEXT_EVENTS,
                                           "response.output_text.delta", "response.output_text.delta", *TEXT_CLOSE,
                                           "response.completed"]
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Hello"
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    final = events[-1]["response"]
    response = sdk.Response.model_validate(final)
    assert response.output_text == "Hello" and response.status == "completed" and response.metadata == {"k": "v"}
    assert final["usage"] == {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 2, "cache_write_tokens": 0},
                              "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 8}
    assert final["output"][0]["status"] == "completed" and final["max_output_tokens"] == 9
    assert final["id"] == "resp-1" and final["created_at"] == 7 and final["completed_at"] >= 7
    whole = ResponsesOutput(req, "resp-1", "demo", demo_tokenizer, created=7)
    for item in items:
        whole.add(item)
    assert without_ids(whole.response()) == without_ids(final)


def test_max_output_tokens_makes_it_incomplete(demo_tokenizer: Tokenizer) -> None:
    events = stream(ResponsesOutput(parse(input="hi"), "r", "demo", demo_tokenizer),
                    [delta("a"), delta("b", "length", generated=2)])
    assert events[-1]["type"] == "response.incomplete"
    final = events[-1]["response"]
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["status"] == "incomplete" and final["completed_at"] is None


def test_function_calls_stream_as_items_after_the_text_before_them(demo_tokenizer: Tokenizer) -> None:
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    req = parse(input="weather?", tools=[WEATHER])
    pieces = [call[i:i + 10] for i in range(0, len(call), 10)]
    events = stream(ResponsesOutput(req, "r", "demo", demo_tokenizer),
                    [delta("Let me check. "), *map(delta, pieces[:-1]), delta(pieces[-1], "stop")])
    fragments = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert len(fragments) > 1  # the arguments stream as the model writes them
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", *TEXT_EVENTS, "response.output_text.delta", *TEXT_CLOSE,
        "response.output_item.added", *["response.function_call_arguments.delta"] * len(fragments),
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    added, done = events[8], events[-3]
    assert added["output_index"] == 1 and added["item"]["status"] == "in_progress" and added["item"]["arguments"] == ""
    assert added["item"]["name"] == "get_weather" and done["item_id"] == added["item"]["id"]
    assert "".join(fragments) == done["arguments"] == '{"city": "Paris"}'
    message, fc = events[-1]["response"]["output"]
    assert message["content"][0]["text"] == "Let me check. "
    assert (fc["type"], fc["name"], fc["arguments"], fc["status"]) == ("function_call", "get_weather",
                                                                        '{"city": "Paris"}', "completed")
    assert fc["call_id"].startswith("call_") and fc["id"] == added["item"]["id"]
    # replayed as input, the output is the assistant turn that made the call
    replay = chat_messages(chat_completion_request(req, output_items(events[-1]["response"]["output"])))
    assert replay == [{"role": "assistant", "content": "Let me check. ", "tool_calls": [
        {"id": fc["call_id"], "type": "function", "function": {"name": "get_weather", "arguments": fc["arguments"]}}]}]


def test_a_call_cut_off_is_incomplete(demo_tokenizer: Tokenizer) -> None:
    req = parse(input="weather?", tools=[WEATHER], tool_choice="required")
    events = stream(ResponsesOutput(req, "r", "demo", demo_tokenizer),
                    [delta('<tool_call>\n{"name": "get_weather", "arguments": {"ci', "length")])
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.incomplete" and [i["type"] for i in final["output"]] == ["function_call"]
    assert final["output"][0]["status"] == "incomplete" and final["output"][0]["arguments"] == '{"ci'


def test_a_failure_closes_the_message_then_error_then_failed_reported_once(demo_tokenizer: Tokenizer) -> None:
    done: list[dict[str, Any]] = []
    output = ResponsesOutput(parse(input="hi"), "r", "demo", demo_tokenizer, on_done=done.append)
    events = output.chunks(delta("par"))
    events += output.error_chunks(openai_error_body(EngineFailedError("device on fire"), "req-1"))
    for event in events:
        SDK_EVENTS[event["type"]].model_validate(event)
    assert [e["type"] for e in events[-5:]] == [*TEXT_CLOSE, "error", "response.failed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert "device on fire" in events[-2]["message"] and events[-2]["code"] is None
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    assert failed["output"][0]["status"] == "incomplete" and failed["output"][0]["content"][0]["text"] == "par"
    assert done == [failed]


# ----- the store -----

class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def entry(name: str) -> StoredResponse:
    return StoredResponse({"id": name}, [])


def test_store_keeps_the_newest_up_to_its_size() -> None:
    store = ResponseStore(2, None)
    for name in ("a", "b", "c"):
        store.put(name, entry(name))
    assert store.get("a") is None and store.get("b").response == {"id": "b"} and len(store) == 2
    store.put("b", entry("b"))  # stored again: the newest now, so "c" goes first
    store.put("d", entry("d"))
    assert (store.get("c"), len(store)) == (None, 2)
    assert store.delete("b") is True and store.delete("b") is False and store.get("b") is None


def test_store_forgets_after_the_ttl() -> None:
    clock = Clock()
    store = ResponseStore(10, 30.0, clock=clock)
    store.put("a", entry("a"))
    clock.now += 10
    store.put("b", entry("b"))
    clock.now += 19.9
    assert store.get("a") is not None and len(store) == 2
    clock.now += 0.1  # a: 30 s old
    assert store.get("a") is None and store.get("b") is not None and len(store) == 1
    clock.now += 10
    assert store.delete("b") is False and len(store) == 0


def test_store_of_size_zero_keeps_nothing_and_bad_bounds_are_refused() -> None:
    store = ResponseStore(0, None)
    store.put("a", entry("a"))
    assert store.get("a") is None
    with pytest.raises(ValueError, match="responses-store-size"):
        ResponseStore(-1, None)
    with pytest.raises(ValueError, match="responses-store-ttl"):
        ResponseStore(1, 0)


def test_store_flags() -> None:
    settings = parse_serve_args(["--responses-store-size", "5", "--responses-store-ttl", "none"], environ={})
    assert (settings.responses_store_size, settings.responses_store_ttl) == (5, None)
    defaults = parse_serve_args([], environ={"TRTLLM_GATEWAY_RESPONSES_STORE_TTL": "60"})
    assert (defaults.responses_store_size, defaults.responses_store_ttl) == (1000, 60.0)


# ----- routes over the scripted engine -----

@pytest.fixture
def engine(tokenizer: Tokenizer) -> ScriptedEngine:
    """Answers with the prompt's own tokens (tests/unit/test_gateway_app.py)."""
    return ScriptedEngine(tokenizer)


@contextlib.contextmanager
def serve(engine: ScriptedEngine, **settings: Any) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(grpc_port=None, **settings), engine)) as c:
        for _ in range(100):
            if c.get("/health").status_code == 200:
                break
        yield c


@pytest.fixture
def client(engine: ScriptedEngine) -> Iterator[TestClient]:
    with serve(engine) as c:
        yield c


def not_found(response_id: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": f"Response with id '{response_id}' not found.", "type": "invalid_request_error",
                      "param": param, "code": None}}


def test_create_retrieve_delete(client: TestClient, engine: ScriptedEngine) -> None:
    r = client.post("/v1/responses", json={"input": "hi", "max_output_tokens": 3, "store": True})
    assert r.status_code == 200, r.text
    body = r.json()
    sdk.Response.model_validate(body)
    prompt = engine.requests[-1].prompt
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = engine.tokenizer.encode(prompt, add_special_tokens=False)
    assert body["output"][0]["content"][0]["text"] == engine.tokenizer.decode(ids[:3])
    assert body["usage"]["input_tokens"] == len(ids) and body["usage"]["output_tokens"] == 3
    assert client.get(f"/v1/responses/{body['id']}").json() == body
    assert client.delete(f"/v1/responses/{body['id']}").json() == {"id": body["id"], "object": "response.deleted",
                                                                   "deleted": True}
    for method in (client.get, client.delete):
        gone = method(f"/v1/responses/{body['id']}")
        assert (gone.status_code, gone.json()) == (404, not_found(body["id"]))


def test_previous_response_continues_the_conversation(client: TestClient, engine: ScriptedEngine) -> None:
    first = client.post("/v1/responses", json={"input": "hi", "instructions": "sys", "max_output_tokens": 2}).json()
    said = first["output"][0]["content"][0]["text"]
    second = client.post("/v1/responses", json={"input": [{"role": "user", "content": "more"}],
                                                "previous_response_id": first["id"], "max_output_tokens": 2})
    assert second.status_code == 200 and second.json()["previous_response_id"] == first["id"]
    # the instructions are not carried over; the earlier input and output are
    assert engine.requests[-1].prompt == (f"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n{said}<|im_end|>\n"
                                          "<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n")


def test_unstored_or_unknown_responses_are_404(client: TestClient) -> None:
    body = client.post("/v1/responses", json={"input": "hi", "max_output_tokens": 1, "store": False}).json()
    assert body["store"] is False and client.get(f"/v1/responses/{body['id']}").status_code == 404
    r = client.post("/v1/responses", json={"input": "hi", "previous_response_id": body["id"]})
    assert (r.status_code, r.json()) == (404, not_found(body["id"], "previous_response_id"))


def test_a_failure_mid_stream_ends_with_error_and_failed(client: TestClient, engine: ScriptedEngine) -> None:
    engine.fail_at_step = 2
    r = client.post("/v1/responses", json={"input": "hello there", "max_output_tokens": 5, "stream": True})
    assert r.status_code == 200
    events = [json.loads(data) for data in sse_data(r.text)]  # JSON all through: no [DONE] marker
    assert [e["type"] for e in events[:3]] == ["response.created", "response.in_progress",
                                               "response.output_item.added"]
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and "device on fire" in failed["error"]["message"]
    assert client.get(f"/v1/responses/{failed['id']}").json() == failed


def test_unknown_fields_are_named_and_ignored(client: TestClient) -> None:
    r = client.post("/v1/responses", json={"input": "hi", "max_output_tokens": 1, "service_tier": "flex", "foo": 1})
    assert r.status_code == 200 and r.headers["x-ignored-fields"] == "foo, service_tier"


def test_store_size_bounds_the_app_store(engine: ScriptedEngine) -> None:
    with serve(engine, responses_store_size=1) as c:
        ids = [c.post("/v1/responses", json={"input": "hi", "max_output_tokens": 1}).json()["id"] for _ in range(2)]
        assert [c.get(f"/v1/responses/{i}").status_code for i in ids] == [404, 200]


def test_input_items_are_listed_as_the_sdks_item_types() -> None:
    """Each kind of input item in OpenAI's listed shape (the SDK's typed item parses it, strictly): ids kept where
    the client sent one, given where not."""
    from adapters.openai.responses_input_items import input_item_list, with_ids

    req = parse(input=[
        {"role": "user", "content": "weather?"},
        {"type": "message", "role": "assistant", "id": "msg_1", "content": "Looking."},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"P"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ])
    items = with_ids(req.input)
    assert [i.id for i in items[1:3]] == ["msg_1", "fc_1"] and items[0].id.startswith("msg_")
    assert items[3].id.startswith("fco_") and with_ids(items) == items  # ids given once
    page = input_item_list(items, {"order": "asc"})
    kinds = (sdk.ResponseInputMessageItem, sdk.ResponseOutputMessage, sdk.ResponseFunctionToolCallItem,
             sdk.ResponseFunctionToolCallOutputItem)
    for kind, item in zip(kinds, page["data"], strict=True):
        kind.model_validate(item, strict=True)
    assert page["data"][1]["content"] == [{"type": "output_text", "text": "Looking.", "annotations": []}]
    assert page["data"][3]["output"] == "sunny" and page["has_more"] is False
