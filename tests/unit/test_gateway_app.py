"""The gateway's routes over a scripted test-only engine (unit level; e2e tests use the real engine).

ScriptedEngine "generates" the prompt's own token ids back, one per step, with fixed logprobs, so
every byte of a response is predictable without a model.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import openai
import pytest
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.settings import Settings
from runtime.engine import Engine, EngineStats, ModelInfo
from runtime.errors import EngineError, InvalidRequestError, PromptTooLongError
from runtime.request import GenerationRequest, OutputDelta, TokenLogprob, Usage
from runtime.tokenizer import Tokenizer

CONTEXT = 64


class ScriptedEngine(Engine):
    """Test-only Engine: sample i of step s is prompt token (s + i) % len(prompt), logprob -0.5."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.model_info = ModelInfo(name="tiny", context_window=CONTEXT, vocab_size=tokenizer.vocab_size,
                                    backend="scripted", dtype="float32", device="cpu")
        self.requests: list[GenerationRequest] = []
        self.aborted: list[str] = []
        self.closed: list[str] = []
        self.reject: EngineError | None = None  # raised at the first __anext__
        self.fail_at_step: int | None = None  # yields an error delta at this step
        self.start_gate = asyncio.Event()
        self.start_gate.set()
        self.step_delay = 0.0
        self.first_delay = 0.0  # seconds before the first step (a request waiting in the queue)
        self.all_at_once = False  # generate_batches hands every delta over in one batch (a front end behind)
        self._ready = False

    @property
    def ready(self) -> bool:
        return self._ready

    async def start(self) -> None:
        await self.start_gate.wait()
        self._ready = True

    async def shutdown(self, drain_timeout: float = 0.0) -> None:
        self._ready = False

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self.requests) - len(self.closed), kv_blocks_total=10,
                           kv_blocks_used=len(self.requests) - len(self.closed))

    async def generate_batches(self, request: GenerationRequest) -> AsyncIterator[list[OutputDelta]]:
        if not self.all_at_once:
            async for batch in super().generate_batches(request):
                yield batch
            return
        yield [delta async for delta in self.generate(request)]

    async def generate(self, request: GenerationRequest) -> AsyncIterator[OutputDelta]:
        self.requests.append(request)
        try:
            if self.reject is not None:
                raise self.reject
            s = request.sampling
            ids = request.prompt_token_ids or self.tokenizer.encode(request.prompt, request.add_special_tokens)
            max_tokens = CONTEXT - len(ids) if s.max_tokens is None else s.max_tokens
            if len(ids) + max_tokens > CONTEXT:
                raise PromptTooLongError(len(ids), max_tokens, CONTEXT)
            await asyncio.sleep(self.first_delay)
            for step in range(max_tokens):
                if step == self.fail_at_step:
                    yield OutputDelta(request.request_id, finish_reason="error", error="device on fire")
                for index in range(s.n):
                    tok = ids[(step + index) % len(ids)]
                    d = OutputDelta(request.request_id, index, [tok], self.tokenizer.decode([tok]))
                    if s.logprobs is not None:
                        d.logprobs = [TokenLogprob(tok, -0.5, [(tok, -0.5), (0, -2.0)][: s.logprobs])]
                    if step == 0 and index == 0:
                        d.prompt_token_ids = list(ids)
                        if s.prompt_logprobs is not None:
                            d.prompt_logprobs = [None] + [TokenLogprob(t, -1.0, [(t, -1.0)][: s.prompt_logprobs])
                                                          for t in ids[1:]]
                    if step == max_tokens - 1:
                        d.finish_reason = "length"
                        if index == s.n - 1:
                            d.usage = Usage(len(ids), max_tokens * s.n)
                    yield d
                await asyncio.sleep(self.step_delay)
        finally:
            self.closed.append(request.request_id)


@pytest.fixture
def engine(tokenizer: Tokenizer) -> ScriptedEngine:
    return ScriptedEngine(tokenizer)


@pytest.fixture
def client(engine: ScriptedEngine):
    with TestClient(create_app(Settings(grpc_port=None), engine)) as c:
        for _ in range(100):
            if c.get("/health").status_code == 200:
                break
        yield c


def sse_data(text: str) -> list[str]:
    return [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]


# ----- health, models, metrics -----

def test_health_is_503_while_loading_then_200(engine: ScriptedEngine) -> None:
    engine.start_gate.clear()
    with TestClient(create_app(Settings(grpc_port=None), engine)) as c:
        r = c.get("/health")
        assert (r.status_code, r.json()) == (503, {"status": "loading"})
        r = c.post("/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 503
        assert r.json()["error"]["type"] == "server_error"
        c.portal.call(engine.start_gate.set)
        for _ in range(100):
            if c.get("/health").status_code == 200:
                break
        assert c.get("/health").json() == {"status": "ready"}


def test_on_ready_runs_once_the_engine_has_started(engine: ScriptedEngine) -> None:
    """`serve` freezes the start-up objects out of the garbage collector here (gateway.cli)."""
    engine.start_gate.clear()
    calls: list[bool] = []
    app = create_app(Settings(grpc_port=None), engine)
    app.state.on_ready = lambda: calls.append(engine.ready)
    with TestClient(app) as c:
        assert calls == []
        c.portal.call(engine.start_gate.set)
        for _ in range(100):
            if c.get("/health").status_code == 200:
                break
        assert calls == [True]


def test_models_lists_served_model_and_lora_adapters(engine: ScriptedEngine) -> None:
    settings = Settings(grpc_port=None)
    settings.engine.lora_modules = {"sql": "/adapters/sql"}
    with TestClient(create_app(settings, engine)) as c:
        body = c.get("/v1/models").json()
    created = body["data"][0]["created"]
    assert body == {"object": "list", "data": [
        {"id": "tiny", "object": "model", "created": created, "owned_by": "trtllm-gateway", "root": "tiny",
         "max_model_len": CONTEXT},
        {"id": "sql", "object": "model", "created": created, "owned_by": "trtllm-gateway",
         "root": "/adapters/sql", "parent": "tiny", "max_model_len": CONTEXT},
    ]}


def test_lora_adapter_name_selects_the_adapter(client: TestClient, engine: ScriptedEngine) -> None:
    client.app.state.settings.engine.lora_modules = {"sql": "/a"}
    r = client.post("/v1/completions", json={"model": "sql", "prompt": "hi", "max_tokens": 1})
    assert r.status_code == 200 and r.json()["model"] == "sql"
    assert engine.requests[-1].adapter == "sql"


def test_metrics_exposes_requests_latencies_tokens_and_engine_gauges(client: TestClient) -> None:
    client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 3})
    text = client.get("/metrics").text
    assert 'trtllm_gateway_requests_total{endpoint="/v1/completions",status="200"} 1.0' in text
    assert "trtllm_gateway_time_to_first_token_seconds_count 1.0" in text
    assert "trtllm_gateway_inter_token_latency_seconds_count 2.0" in text
    assert "trtllm_gateway_e2e_request_latency_seconds_count 1.0" in text
    assert "trtllm_gateway_generation_tokens_total 3.0" in text
    assert "trtllm_gateway_kv_blocks_total 10.0" in text
    assert "trtllm_gateway_requests_running 0.0" in text
    assert "engine_core" not in text  # one engine core: no per-core series (--data-parallel-size has them)


# ----- completions / chat over the scripted engine -----

def test_completion_exact_response(client: TestClient, tokenizer: Tokenizer) -> None:
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": "hello", "max_tokens": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    ids = tokenizer.encode("hello")
    assert body["id"].startswith("cmpl-") and r.headers["x-request-id"]
    assert body["choices"] == [{"index": 0, "text": tokenizer.decode([ids[i % len(ids)] for i in range(3)]),
                                "logprobs": None, "finish_reason": "length"}]
    assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 3, "total_tokens": len(ids) + 3, "prompt_tokens_details": {"cached_tokens": 0}}
    openai.types.Completion.model_validate(body)


def test_completion_list_prompts_and_n_index_choices(client: TestClient, engine: ScriptedEngine) -> None:
    r = client.post("/v1/completions", json={"prompt": [[5, 6], [7, 8, 9]], "n": 2, "max_tokens": 2})
    body = r.json()
    texts = {c["index"]: c["text"] for c in body["choices"]}
    dec = engine.tokenizer.decode
    assert texts == {0: dec([5, 6]), 1: dec([6, 5]), 2: dec([7, 8]), 3: dec([8, 9])}
    assert [q.request_id for q in engine.requests] == [body["id"] + "-0", body["id"] + "-1"]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13, "prompt_tokens_details": {"cached_tokens": 0}}


def test_completion_echo_with_logprobs(client: TestClient, tokenizer: Tokenizer) -> None:
    r = client.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": 1, "echo": True, "logprobs": 1})
    choice = r.json()["choices"][0]
    t5, t6 = tokenizer.token_text(5), tokenizer.token_text(6)
    assert choice["text"] == tokenizer.decode([5, 6], skip_special_tokens=False) + tokenizer.decode([5])
    assert choice["logprobs"] == {
        "tokens": [t5, t6, t5],
        "token_logprobs": [None, -1.0, -0.5],
        "top_logprobs": [None, {t6: -1.0}, {t5: -0.5}],
        "text_offset": [0, len(t5), len(t5) + len(t6)],
    }


def test_chat_exact_response_with_logprobs(client: TestClient, engine: ScriptedEngine) -> None:
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "developer", "content": "be brief"},
                     {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "max_completion_tokens": 2, "max_tokens": 9, "logprobs": True, "top_logprobs": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    req = engine.requests[-1]
    assert req.prompt == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert req.add_special_tokens is False and req.sampling.max_tokens == 2 and req.sampling.logprobs == 2
    ids = engine.tokenizer.encode(req.prompt, add_special_tokens=False)
    tok = engine.tokenizer
    entry = lambda t: {"token": tok.token_text(t), "logprob": -0.5, "bytes": tok.token_bytes(t),  # noqa: E731
                       "top_logprobs": [{"token": tok.token_text(t), "logprob": -0.5, "bytes": tok.token_bytes(t)},
                                        {"token": tok.token_text(0), "logprob": -2.0, "bytes": tok.token_bytes(0)}]}
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": tok.decode(ids[:2]), "refusal": None},
                                "logprobs": {"content": [entry(ids[0]), entry(ids[1])], "refusal": None},
                                "finish_reason": "length"}]
    assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 2, "total_tokens": len(ids) + 2, "prompt_tokens_details": {"cached_tokens": 0}}
    openai.types.chat.ChatCompletion.model_validate(body)


def test_chat_stream_role_first_finish_last_usage_then_done(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "n": 2, "stream": True,
        "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_data(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    for c in chunks:
        openai.types.chat.ChatCompletionChunk.model_validate(c)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert all(c["usage"] is None for c in chunks[:-1])
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks[:-1] if c["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
        assert all("role" not in c["delta"] for c in mine[1:])
        assert [c["finish_reason"] for c in mine] == [None] * (len(mine) - 1) + ["length"]


def test_deltas_waiting_together_go_out_as_one_chunk_per_choice(client: TestClient, engine: ScriptedEngine) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "n": 2, "logprobs": True,
            "top_logprobs": 1}
    whole = client.post("/v1/chat/completions", json=body).json()
    engine.all_at_once = True
    r = client.post("/v1/chat/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}})
    chunks = [json.loads(e) for e in sse_data(r.text)[:-1]]
    assert chunks[-1]["usage"] == whole["usage"]
    for choice in whole["choices"]:
        mine = [c["choices"][0] for c in chunks[:-1] if c["choices"][0]["index"] == choice["index"]]
        assert [c["delta"].get("role") for c in mine] == ["assistant", None]  # the role, then all 3 tokens at once
        assert mine[1]["delta"]["content"] == choice["message"]["content"]
        assert mine[1]["logprobs"]["content"] == choice["logprobs"]["content"]
        assert mine[1]["finish_reason"] == "length"


def test_completion_stream_text_matches_non_stream(client: TestClient) -> None:
    body = {"prompt": "hello world", "max_tokens": 4}
    whole = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    r = client.post("/v1/completions", json={**body, "stream": True})
    chunks = [json.loads(e) for e in sse_data(r.text)[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in c for c in chunks)


# ----- errors -----

def test_malformed_json_is_400(client: TestClient) -> None:
    r = client.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and "could not parse the JSON body" in err["message"]


def test_invalid_field_is_400_naming_param(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "top_p": 7})
    assert r.status_code == 400
    assert r.json() == {"error": {"message": "Invalid value for 'top_p': Input should be less than or equal to 1.",
                                  "type": "invalid_request_error", "param": "top_p", "code": None}}


def test_unsupported_spec_field_is_400(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                  "prediction": {"type": "content", "content": "x"}})
    assert r.status_code == 400
    assert r.json()["error"] == {"message": "Unsupported parameter: 'prediction' is not supported by this "
                                            "server yet.", "type": "invalid_request_error",
                                 "param": "prediction", "code": "unsupported_parameter"}


def test_unknown_model_is_404(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"model": "gpt-9", "prompt": "x"})
    assert r.status_code == 404
    assert r.json()["error"] == {"message": "The model `gpt-9` does not exist.", "type": "invalid_request_error",
                                 "param": None, "code": "model_not_found"}


def test_prompt_too_long_is_400_with_both_numbers(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"prompt": [1] * 10, "max_tokens": 60})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "max_tokens"
    assert f"maximum context length is {CONTEXT} tokens" in err["message"] and "(10 in the prompt, 60 for the" \
        in err["message"]


def test_engine_rejection_before_stream_gets_real_status(client: TestClient, engine: ScriptedEngine) -> None:
    from runtime.errors import QueueFullError

    engine.reject = QueueFullError("queue is full (1 waiting)")
    r = client.post("/v1/completions", json={"prompt": "x", "stream": True})
    assert r.status_code == 429
    assert r.json()["error"] == {"message": "queue is full (1 waiting)", "type": "requests", "param": None,
                                 "code": "rate_limit_exceeded"}


def test_engine_failure_is_500_with_request_id(client: TestClient, engine: ScriptedEngine) -> None:
    engine.fail_at_step = 1
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3}, headers={"x-request-id": "abc123"})
    assert r.status_code == 500 and r.headers["x-request-id"] == "abc123"
    err = r.json()["error"]
    assert err["type"] == "server_error" and "device on fire" in err["message"] and "abc123" in err["message"]


def test_mid_stream_failure_is_an_error_event_then_done(client: TestClient, engine: ScriptedEngine) -> None:
    engine.fail_at_step = 2
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                  "max_tokens": 5, "stream": True})
    events = sse_data(r.text)
    assert r.status_code == 200 and events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert err["type"] == "server_error" and "device on fire" in err["message"]
    assert engine.closed == [engine.requests[-1].request_id]


def test_unknown_route_is_openai_404_and_logged_as_such(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="gateway.errors"):
        r = client.post("/v1/nope", json={})
        wrong_method = client.get("/v1/chat/completions")
    assert r.status_code == 404 and r.json()["error"]["message"] == "Invalid URL (POST /v1/nope)"
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["type"] == "invalid_request_error"
    rejections = [rec.getMessage() for rec in caplog.records if "rejected with" in rec.getMessage()]
    assert any("rejected with 404: Invalid URL (POST /v1/nope)" in m for m in rejections), rejections
    assert any("rejected with 405" in m for m in rejections), rejections
    assert not any("rejected with 400" in m for m in rejections), rejections


def test_api_keys_guard_v1_but_not_health(engine: ScriptedEngine) -> None:
    with TestClient(create_app(Settings(grpc_port=None, api_key=["sekrit"]), engine)) as c:
        assert c.get("/health").status_code in (200, 503)
        r = c.get("/v1/models")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert c.get("/v1/models", headers={"authorization": "Bearer sekrit"}).status_code == 200


# ----- disconnects (in-process ASGI: the transport reports the disconnect) -----

class AsgiCall:
    """One POST straight into the ASGI app, with a client that disconnects when `disconnect` is set."""

    def __init__(self, app, body: dict) -> None:
        self.disconnect = asyncio.Event()
        self.sent: list[dict] = []
        self._messages = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]
        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [], "query_string": b"",
                 "http_version": "1.1", "scheme": "http", "server": ("t", 80), "client": ("c", 1),
                 "root_path": "", "state": {}}
        self.task = asyncio.create_task(app(scope, self._receive, self._send))

    async def _receive(self) -> dict:
        if self._messages:
            return self._messages.pop(0)
        await self.disconnect.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict) -> None:
        assert not self.sent or self.sent[-1].get("more_body", True), f"{message} sent after the response ended"
        self.sent.append(message)

    def body(self) -> str:
        return b"".join(m.get("body", b"") for m in self.sent[1:]).decode()

    async def ended(self, within: float = 30.0) -> None:
        """The call returned (not cancelled, not failed) within `within` seconds; waiting cancels nothing, so a
        cancellation cannot be what ends it."""
        done, _ = await asyncio.wait({self.task}, timeout=within)
        if not done:
            self.task.cancel()
            pytest.fail(f"the request still runs after {within} s")
        self.task.result()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("when", ["mid-stream", "before the first token"])
async def test_request_is_aborted_when_client_disconnects(engine: ScriptedEngine, stream: bool, when: str) -> None:
    engine.step_delay = 0.05
    if when != "mid-stream":
        engine.first_delay = 300.0  # longer than any wait below: only the disconnect can end the request
    app = create_app(Settings(grpc_port=None), engine)
    await engine.start()
    call = AsgiCall(app, {"prompt": "x", "max_tokens": 50, "stream": stream})  # 50 steps: 2.5 s
    await asyncio.sleep(0.2)
    call.disconnect.set()
    await call.ended()
    rid = engine.requests[-1].request_id
    assert rid in engine.aborted and rid in engine.closed
    assert len(engine.closed) == 1  # stopped early: the engine generator was closed, not exhausted
    assert call.sent[0]["status"] == (200 if stream and when == "mid-stream" else 499)


async def test_a_cancelled_stream_is_cancelled_not_ended_and_aborts(engine: ScriptedEngine) -> None:
    """A cancellation that is not the client leaving (the server shutting down) goes on up."""
    engine.step_delay = 0.05
    app = create_app(Settings(grpc_port=None), engine)
    await engine.start()
    call = AsgiCall(app, {"prompt": "x", "max_tokens": 50, "stream": True})
    await asyncio.sleep(0.2)
    call.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(call.task, 5)
    rid = engine.requests[-1].request_id
    assert rid in engine.aborted and rid in engine.closed


async def test_a_quiet_stream_gets_keep_alive_comments(engine: ScriptedEngine,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gateway.streaming.PING_INTERVAL_S", 0.05)
    engine.step_delay = 0.3
    app = create_app(Settings(grpc_port=None), engine)
    await engine.start()
    call = AsgiCall(app, {"prompt": "x y", "max_tokens": 2, "stream": True})
    await call.ended()
    body = call.body()
    pings = [line for line in body.splitlines() if line.startswith(": ping - ")]
    assert pings, body  # 0.3 s between the two steps, a ping due every 0.05 s
    events = [json.loads(d) for d in sse_data(body)[:-1]]
    assert sse_data(body)[-1] == "[DONE]"
    assert sum(len(c["choices"][0]["text"]) > 0 for c in events if c["choices"]) == 2
    assert call.sent[-1]["more_body"] is False and call.sent[-1]["body"].endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("name", ["tiny", "ensemble", "tensorrt_llm", "tensorrt_llm_bls"])
def test_lora_modules_named_like_a_model_are_a_start_up_error(engine: ScriptedEngine, name: str) -> None:
    settings = Settings(grpc_port=None)
    settings.engine.lora_modules = {name: "/adapters/x"}
    with pytest.raises(InvalidRequestError, match=f"--lora-modules: the adapter name '{name}' is already a model"):
        create_app(settings, engine)


@pytest.mark.parametrize("stream", [False, True])
def test_unknown_fields_are_ignored_but_named(client: TestClient, caplog: pytest.LogCaptureFixture,
                                              stream: bool) -> None:
    """Fields we do not know are ignored, as vLLM does (clients add their own), never silently: the response
    names them in a header and the log warns. Known ones bring no header."""
    with caplog.at_level("WARNING", logger="gateway.openai"):
        r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "stream": stream, "foo": 1,
                                                 "reasoning_effort": "low"})
    assert r.status_code == 200 and r.headers["x-ignored-fields"] == "foo, reasoning_effort"
    assert any("ignored unknown fields foo, reasoning_effort" in rec.getMessage() for rec in caplog.records)
    plain = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "stream": stream})
    assert plain.status_code == 200 and "x-ignored-fields" not in plain.headers


def test_ignored_field_names_cannot_break_the_header(client: TestClient) -> None:
    """Names with non-Latin-1 or control characters are JSON-escaped; past 16 the rest are counted."""
    body = {"prompt": "x", "max_tokens": 1, "caf\u00e9\U0010189a": 1, "a\r\nSet-Cookie: x=1": 2}
    body.update({f"f{i:02d}": i for i in range(20)})
    r = client.post("/v1/completions", json=body)
    named = r.headers["x-ignored-fields"]
    assert r.status_code == 200 and named.isascii() and "\r" not in named and "\n" not in named
    assert named.startswith("a\\r\\nSet-Cookie: x=1, caf\\u00e9\\udbc6\\udc9a, f00") and named.endswith("(and 6 more)")
    assert "set-cookie" not in r.headers


def test_rejected_values_are_logged_cut_short(caplog: pytest.LogCaptureFixture) -> None:
    """A 4,000-digit number made a 4 KB log line."""
    from gateway.errors import log_error
    from runtime.errors import InvalidRequestError

    with caplog.at_level("INFO", logger="gateway.errors"):
        log_error(InvalidRequestError(f"logit_bias token id {'1' * 4000} is outside the vocabulary"), "r1")
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("request r1 rejected with 400: logit_bias token id 111") and len(line) < 400
    assert line.endswith("... (4046 characters)")
