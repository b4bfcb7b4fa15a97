"""Every error of the OpenAI API, through the real server: exact status, OpenAI error object, request id.

Fault injection (a request whose output processing raises) wraps one method of the real native
engine instance; nothing else is mocked.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from runtime.errors import PromptTooLongError
from runtime.native.request_state import RequestState
from tests.e2e.conftest import MODEL_NAME, RunningServer, reference_greedy, scrape, wait_for

CONTEXT = 256  # max_position_embeddings of the tiny model


def assert_openai_error(r: httpx.Response, status: int, type_: str, code: str | None,
                        param: str | None = None) -> dict[str, Any]:
    """The response is `status` with exactly OpenAI's error object, and echoes a request id."""
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    err = body["error"]
    assert (err["type"], err["code"], err["param"]) == (type_, code, param)
    assert isinstance(err["message"], str) and err["message"]
    assert r.headers["x-request-id"]
    return err


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_malformed_json_is_400(http: httpx.Client, path: str) -> None:
    r = http.post(path, content=b'{"model": "tiny", "prompt": ', headers={"content-type": "application/json"})
    err = assert_openai_error(r, 400, "invalid_request_error", None)
    assert err["message"].startswith("We could not parse the JSON body of your request")


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"prompt": "hi", "temperature": 5}, "temperature"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "many"}, "max_tokens"),
    ("/v1/completions", {"max_tokens": 3}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_p": 0}, "top_p"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"x": 1}},
     "logit_bias"),
])
def test_invalid_field_is_400_naming_it(http: httpx.Client, path: str, body: dict, param: str) -> None:
    err = assert_openai_error(http.post(path, json={"model": MODEL_NAME, **body}), 400, "invalid_request_error",
                              None, param)
    assert f"'{param}'" in err["message"]


def test_invalid_field_through_the_sdk_names_param(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], n=0)
    assert info.value.status_code == 400 and info.value.param == "n"
    assert info.value.type == "invalid_request_error"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_unknown_model_is_404(http: httpx.Client, path: str) -> None:
    body = {"model": "no-such-model", "prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}
    err = assert_openai_error(http.post(path, json=body), 404, "invalid_request_error", "model_not_found")
    assert err["message"] == "The model `no-such-model` does not exist."


def test_unknown_route_is_404_in_openai_shape(http: httpx.Client) -> None:
    assert_openai_error(http.post("/v1/nothing", json={}), 404, "invalid_request_error", None)


def test_prompt_plus_max_tokens_over_context_is_400_with_both_numbers(http: httpx.Client,
                                                                        server: RunningServer) -> None:
    prompt = "the cat sat on the mat"
    n_prompt = len(server.engine.tokenizer.encode(prompt))
    r = http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": CONTEXT})
    err = assert_openai_error(r, 400, "invalid_request_error", "context_length_exceeded", "max_tokens")
    assert err["message"] == PromptTooLongError(n_prompt, CONTEXT, CONTEXT).message
    assert f"{n_prompt} in the prompt" in err["message"] and f"{CONTEXT} for the completion" in err["message"]


def test_chat_over_context_is_400(http: httpx.Client) -> None:
    r = http.post("/v1/chat/completions", json={"model": MODEL_NAME, "max_tokens": CONTEXT,
                                                 "messages": [{"role": "user", "content": "hello"}]})
    err = assert_openai_error(r, 400, "invalid_request_error", "context_length_exceeded", "max_tokens")
    assert f"maximum context length is {CONTEXT} tokens" in err["message"]


# ---- queue full ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def one_slot_server(tiny_model_dir) -> Iterator[RunningServer]:
    """One running request at a time and one waiting: the third concurrent request overflows."""
    from tests.e2e.conftest import launch

    # in-process engine: the test slows its output processing down
    srv = launch(tiny_model_dir, "native", max_batch_size=1, max_queue_size=1, engine_process=False)
    yield srv
    srv.stop()


LONG = {"model": MODEL_NAME, "prompt": "count", "max_tokens": 200, "temperature": 0, "ignore_eos": True}


def test_queue_full_is_429_with_retry_after_and_others_finish(one_slot_server: RunningServer,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    url = one_slot_server.url
    engine = one_slot_server.engine
    original = engine.scheduler.update_from_output

    def slow(*args, **kwargs):  # ~2 s for the running request's 200 steps: it cannot end before the checks
        time.sleep(0.01)
        return original(*args, **kwargs)

    monkeypatch.setattr(engine.scheduler, "update_from_output", slow)
    waiting_result: dict[str, httpx.Response] = {}
    with httpx.Client(base_url=url, timeout=60) as c, c.stream("POST", "/v1/completions",
                                                               json={**LONG, "stream": True}) as running:
        lines = running.iter_lines()
        assert next(lines).startswith("data: ")  # the first request is running now

        def wait_in_queue() -> None:
            waiting_result["r"] = httpx.post(url + "/v1/completions", timeout=60,
                                             json={**LONG, "max_tokens": 5, "prompt": "the dog"})

        queued = threading.Thread(target=wait_in_queue)
        queued.start()
        wait_for(lambda: scrape(url)["trtllm_gateway_requests_waiting"] == 1, what="one waiting request")
        r = c.post("/v1/completions", json={**LONG, "max_tokens": 5})
        err = assert_openai_error(r, 429, "requests", "rate_limit_exceeded")
        assert r.headers["retry-after"] == "1"
        assert "queue is full" in err["message"]
        rest = [line for line in lines if line]
    queued.join(60)
    assert rest[-1] == "data: [DONE]"  # the running stream was not disturbed
    text = "".join(json.loads(line[6:])["choices"][0]["text"] for line in rest[:-1] if line.startswith("data: {"))
    assert text  # and produced its output
    assert waiting_result["r"].status_code == 200
    assert waiting_result["r"].json()["usage"]["completion_tokens"] == 5


# ---- engine failure and fault isolation -----------------------------------------------------------

POISON = "poison pill"


@pytest.fixture(scope="module")
def in_process_server(tiny_model_dir) -> Iterator[RunningServer]:
    """The native engine in the gateway's process, where a test can wrap its methods."""
    from tests.e2e.conftest import launch

    srv = launch(tiny_model_dir, "native", engine_process=False)
    yield srv
    srv.stop()


@pytest.fixture
def poisoned(in_process_server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> RunningServer:
    """Output processing raises at the third token of any request whose prompt holds POISON, so the failure
    comes after the first outputs: mid-stream for streams. (Its second and third tokens take the fast lane of
    requests whose output is their ids, RequestState.add_plain_token.)"""
    server = in_process_server
    original = RequestState.add_plain_token
    tokens: dict[str, int] = {}

    def faulty(state: RequestState, *args, **kwargs):
        if POISON in (state.request.prompt or ""):
            tokens[state.request_id] = tokens.get(state.request_id, 1) + 1
            if tokens[state.request_id] >= 3:
                raise RuntimeError("injected fault")
        return original(state, *args, **kwargs)

    monkeypatch.setattr(RequestState, "add_plain_token", faulty)
    return server


def test_engine_failure_is_500_with_request_id(poisoned: RunningServer) -> None:
    r = httpx.post(poisoned.url + "/v1/completions", headers={"x-request-id": "req-fault-1"}, timeout=60,
                   json={"model": MODEL_NAME, "prompt": POISON, "max_tokens": 8, "ignore_eos": True})
    err = assert_openai_error(r, 500, "server_error", None)
    assert r.headers["x-request-id"] == "req-fault-1"
    assert err["message"].startswith("The server had an error while processing your request")
    assert "(request id: req-fault-1)" in err["message"]


def test_stream_failure_is_an_error_event_with_request_id(poisoned: RunningServer) -> None:
    with httpx.stream("POST", poisoned.url + "/v1/chat/completions", headers={"x-request-id": "req-fault-2"},
                      json={"model": MODEL_NAME, "messages": [{"role": "user", "content": POISON}],
                            "max_tokens": 8, "ignore_eos": True, "stream": True}, timeout=60) as r:
        lines = [line for line in r.iter_lines() if line]
    assert r.status_code == 200 and lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines[:-1]]
    assert any(e.get("choices") for e in events[:-1])  # outputs came before the failure
    assert set(events[-1]) == {"error"} and events[-1]["error"]["type"] == "server_error"
    assert "(request id: req-fault-2)" in events[-1]["error"]["message"]


async def test_a_failing_request_never_disturbs_the_others(poisoned: RunningServer, hf_model) -> None:
    tok = poisoned.engine.tokenizer
    prompts = ["the cat", "hello world", "in the beginning"]
    async with httpx.AsyncClient(base_url=poisoned.url, timeout=60) as c:
        async def one(prompt: str) -> httpx.Response:
            return await c.post("/v1/completions", json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": 8,
                                                         "temperature": 0, "ignore_eos": True})
        results = await asyncio.gather(*(one(p) for p in [prompts[0], POISON, prompts[1], POISON, prompts[2]]))
    assert [r.status_code for r in results] == [200, 500, 200, 500, 200]
    for prompt, r in zip(prompts, [results[0], results[2], results[4]]):
        want, _ = reference_greedy(hf_model, tok.encode(prompt), 8)
        assert r.json()["choices"][0]["text"] == tok.decode(want)
    # The engine goes on: blocks of the failed requests are back and new requests are served.
    wait_for(lambda: scrape(poisoned.url)["trtllm_gateway_kv_blocks_used"] == 0, what="KV blocks freed")
    assert httpx.get(poisoned.url + "/health").status_code == 200


# ---- request timeout -------------------------------------------------------------------------------

def test_request_timeout_aborts_and_frees_blocks(start_server) -> None:
    """After a few steps the engine holds each step until the request's deadline has passed, so however
    fast the machine, the request cannot finish its 240 tokens inside the 0.1 s timeout."""
    srv = start_server("native", gateway={"request_timeout": 0.1})
    engine = srv.engine
    before = engine.stats().generation_tokens_total
    steps = 0
    step = engine.step

    def held_step() -> int:
        nonlocal steps
        steps += 1
        deadlines = [s.request.deadline for s in engine.core.requests.values() if s.request.deadline is not None]
        if steps > 4 and deadlines:
            time.sleep(max(0.0, max(deadlines) - time.monotonic()))
        return step()

    engine.step = held_step
    r = httpx.post(srv.url + "/v1/completions", timeout=60, json={**LONG, "max_tokens": 240})
    err = assert_openai_error(r, 504, "server_error", "timeout")
    assert "request timeout of 0.1 s" in err["message"]
    wait_for(lambda: scrape(srv.url)["trtllm_gateway_kv_blocks_used"] == 0, what="KV blocks freed")
    assert engine.stats().generation_tokens_total - before < 240  # aborted, not run to the end


# ---- hostile input: invalid Unicode, huge integers, malformed tool calls ------------------------------
# Raw bytes, as a client that does not validate its JSON sends them: `\ud800` is a lone UTF-16 surrogate.

SURROGATE = "holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not valid Unicode"
HUGE = b"9" * 5000  # past Python's 4300-digit limit for int()


def post_raw(http: httpx.Client, path: str, body: bytes) -> httpx.Response:
    return http.post(path, content=body, headers={"content-type": "application/json"})


def assert_models_still_listed(http: httpx.Client) -> None:
    r = http.get("/v1/models")
    assert r.status_code == 200 and MODEL_NAME in [m["id"] for m in r.json()["data"]]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", rb'{"model": "tiny", "prompt": "\ud800", "max_tokens": 1}', "prompt"),
    ("/v1/completions", rb'{"model": "tiny", "prompt": ["ok", "\udfff"], "max_tokens": 1}', "prompt[1]"),
    ("/v1/completions", rb'{"model": "\ud800", "prompt": "hi", "max_tokens": 1}', "model"),
    ("/v1/completions", rb'{"model": "tiny", "prompt": "hi", "stop": ["\ud800"], "max_tokens": 1}', "stop[0]"),
    ("/v1/chat/completions", rb'{"model": "tiny", "messages": [{"role": "user", "content": "\ud800"}]}',
     "messages[0].content"),
    ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',
     "messages[0].content"),
])
def test_lone_surrogates_are_an_openai_400(http: httpx.Client, path: str, body: bytes, param: str) -> None:
    err = assert_openai_error(post_raw(http, path, body), 400, "invalid_request_error", None, param)
    assert err["message"] == (f"We could not parse the JSON body of your request: '{param}' {SURROGATE}. "
                              "The OpenAI API expects a JSON payload (Content-Type: application/json).")
    assert_models_still_listed(http)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_an_integer_of_5000_digits_is_an_openai_400(http: httpx.Client, path: str) -> None:
    body = b'{"model": "tiny", "prompt": "hi", "messages": [{"role": "user", "content": "hi"}], "max_tokens": '
    err = assert_openai_error(post_raw(http, path, body + HUGE + b"}"), 400, "invalid_request_error", None)
    assert err["message"].startswith("We could not parse the JSON body of your request: a number has more than "
                                     "4300 digits.")
    assert_models_still_listed(http)


@pytest.mark.parametrize(("endpoint", "body", "where"), [
    ("generate", rb'{"text_input": "\ud800", "max_tokens": 1}', "'text_input'"),
    ("generate", rb'{"text_input": "hi", "max_tokens": 1, "bad_words": ["x", "\ud800"]}', "'bad_words[1]'"),
    ("generate", rb'{"text_input": "hi", "max_tokens": 1, "stop_words": "\udc00"}', "'stop_words'"),
    ("generate", rb'{"parameters": {"\ud800": 1}, "text_input": "hi", "max_tokens": 1}', "'parameters.\\ud800'"),
    ("generate_stream", rb'{"text_input": "\ud800", "max_tokens": 1, "stream": true}', "'text_input'"),
])
def test_lone_surrogates_are_a_triton_400(http: httpx.Client, endpoint: str, body: bytes, where: str) -> None:
    r = post_raw(http, f"/v2/models/ensemble/{endpoint}", body)
    assert (r.status_code, r.json()) == (400, {"error": f"failed to parse the request JSON buffer: {where} {SURROGATE}"})
    assert_models_still_listed(http)


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
def test_an_integer_of_5000_digits_is_a_triton_400(http: httpx.Client, endpoint: str) -> None:
    r = post_raw(http, f"/v2/models/ensemble/{endpoint}", b'{"text_input": "hi", "max_tokens": ' + HUGE + b"}")
    assert (r.status_code, r.json()) == (400, {"error": "failed to parse the request JSON buffer: a number has more "
                                                         "than 4300 digits"})
    assert_models_still_listed(http)


@pytest.mark.parametrize(("tool_call", "param", "message"), [
    ({"foo": 1}, "messages[1].tool_calls[0].id", "Missing required parameter: 'messages[1].tool_calls[0].id'."),
    ({"id": "c1", "type": "function", "function": {"name": "f"}}, "messages[1].tool_calls[0].function.arguments",
     "Missing required parameter: 'messages[1].tool_calls[0].function.arguments'."),
    ({"id": "c1", "type": "web", "function": {"name": "f", "arguments": "{}"}}, "messages[1].tool_calls[0].type",
     "Invalid value for 'messages[1].tool_calls[0].type': Input should be 'function'."),
])
def test_malformed_tool_calls_are_a_400_naming_the_field(http: httpx.Client, tool_call: dict, param: str,
                                                         message: str) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [tool_call]},
                {"role": "tool", "tool_call_id": "c1", "content": "18"}]
    r = http.post("/v1/chat/completions", json={"model": MODEL_NAME, "messages": messages, "max_tokens": 1})
    assert assert_openai_error(r, 400, "invalid_request_error", None, param)["message"] == message
