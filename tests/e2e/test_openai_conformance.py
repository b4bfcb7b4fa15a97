"""Shapes real clients check (issue 18, items 2 and 3): GET /v1/models/{model} (the SDK's models.retrieve),
`refusal: null` in chat messages and the role chunk, stream_options.continuous_usage_stats (vLLM's
extension, aiperf --per-chunk-usage), and usage.prompt_tokens_details.cached_tokens."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL_NAME, RunningServer, scrape
from tests.lora_adapters import make_peft_adapter

MESSAGES = [{"role": "user", "content": "Say hello"}]


def not_found(name: str) -> dict:
    return {"error": {"message": f"The model `{name}` does not exist.", "type": "invalid_request_error",
                      "param": "model", "code": "model_not_found"}}


def sse_chunks(r: httpx.Response) -> list[dict]:
    """The JSON events of a stream, [DONE] checked and dropped."""
    assert r.status_code == 200, r.text
    events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


# ----- GET /v1/models/{model} -----

def test_retrieve_is_the_list_entry(client: openai.OpenAI, http: httpx.Client) -> None:
    listed = http.get("/v1/models").json()["data"]
    r = http.get(f"/v1/models/{MODEL_NAME}")
    assert r.status_code == 200 and r.json() == listed[0] and listed[0]["id"] == MODEL_NAME
    assert client.models.retrieve(MODEL_NAME) == client.models.list().data[0]


def test_retrieve_unknown_is_openai_404(client: openai.OpenAI, http: httpx.Client) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    assert info.value.status_code == 404 and info.value.body == not_found("no-such-model")["error"]
    r = http.get("/v1/models/org/no-such-model")
    assert (r.status_code, r.json()) == (404, not_found("org/no-such-model"))


def test_retrieve_slashed_ids_adapters_and_auth(start_server: Callable[..., RunningServer], tiny_model_dir: Path,
                                                tmp_path: Path) -> None:
    """Ids with "/" (served model and adapter) resolve whole; the route asks for the key as /v1/models does."""
    adapter = make_peft_adapter(tiny_model_dir, tmp_path / "sql", ["q_proj"], r=2, seed=3)
    srv = start_server("native", gateway={"api_key": ["sekrit"]}, served_model_name="org/tiny",
                       lora_modules={"team/sql": str(adapter)})
    client = openai.OpenAI(base_url=srv.base_url, api_key="sekrit", max_retries=0)
    listed = {m.id: m for m in client.models.list().data}
    assert list(listed) == ["org/tiny", "team/sql"]
    for name, card in listed.items():
        assert client.models.retrieve(name) == card
    assert client.models.retrieve("team/sql").model_dump()["parent"] == "org/tiny"
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("tiny")  # the shared server's name: not served here
    assert info.value.body == not_found("tiny")["error"]
    for headers in ({}, {"authorization": "Bearer wrong"}):
        for path in ("/v1/models", "/v1/models/org/tiny", "/v1/models/nope"):
            r = httpx.get(srv.base_url + path.removeprefix("/v1"), headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_openapi_documents_retrieve(http: httpx.Client) -> None:
    op = http.get("/openapi.json").json()["paths"]["/v1/models/{model}"]["get"]
    assert op["responses"]["200"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ModelCard"}
    assert set(op["responses"]) == {"200", "401", "404", "503"}


# ----- refusal: null -----

def test_chat_message_has_refusal_null(http: httpx.Client, client: openai.OpenAI) -> None:
    body = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 3, "temperature": 1.0, "seed": 5, "n": 2,
            "ignore_eos": True}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        message = choice["message"]
        assert list(message) == ["role", "content", "refusal"] and message["refusal"] is None
        assert message["role"] == "assistant" and isinstance(message["content"], str) and message["content"]
    out = client.chat.completions.create(**{k: v for k, v in body.items() if k != "ignore_eos"},
                                         extra_body={"ignore_eos": True})
    assert [c.message.refusal for c in out.choices] == [None, None]


def test_chat_role_chunk_has_refusal_null_and_later_chunks_do_not(http: httpx.Client) -> None:
    chunks = sse_chunks(http.post("/v1/chat/completions", json={
        "model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 3, "temperature": 0, "ignore_eos": True,
        "stream": True}))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": "", "refusal": None}
    assert all("refusal" not in d and "role" not in d for d in deltas[1:])


# ----- stream_options.continuous_usage_stats -----

def _stream(http: httpx.Client, path: str, stream_options: dict | None) -> list[dict]:
    # With logprobs every token gets its chunk: without, a token that ends inside a UTF-8 character (the tiny
    # byte-level vocabulary has many) holds its text back and shares the next token's chunk.
    body: dict = {"model": MODEL_NAME, "max_tokens": 5, "temperature": 0, "ignore_eos": True, "stream": True}
    if path.endswith("chat/completions"):
        body.update(messages=MESSAGES, logprobs=True)
    else:
        body.update(prompt=[11, 12, 13, 14, 15, 16, 17], logprobs=0)
    if stream_options is not None:
        body["stream_options"] = stream_options
    return sse_chunks(http.post(path, json=body))


def _prompt_tokens(http: httpx.Client, path: str) -> int:
    body = {"model": MODEL_NAME, "max_tokens": 1, "messages": MESSAGES, "prompt": [11, 12, 13, 14, 15, 16, 17]}
    return http.post(path, json=body).json()["usage"]["prompt_tokens"]


def _tokens(chunk: dict) -> list:
    logprobs = chunk["choices"][0]["logprobs"]
    if logprobs is None:
        return []
    return logprobs["content"] if "content" in logprobs else logprobs["tokens"]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("include_usage", [True, False])
def test_continuous_usage_on_every_chunk(http: httpx.Client, path: str, include_usage: bool) -> None:
    prompt_tokens = _prompt_tokens(http, path)
    chunks = _stream(http, path, {"continuous_usage_stats": True, "include_usage": include_usage})
    body = [c for c in chunks if c["choices"]]
    # chat's role chunk goes out before the first token, as vLLM sends it
    first = [0] if path.endswith("chat/completions") else []
    # each chunk counts the tokens sent so far (tokens that wait together go out as one chunk)
    sent = list(itertools.accumulate(len(_tokens(c)) for c in body))
    assert [c["usage"]["completion_tokens"] for c in body] == sent and sent[-1] == 5
    assert sent[: len(first)] == first and all(len(_tokens(c)) for c in body[len(first):])
    for c in body:
        u = c["usage"]
        assert u == {"prompt_tokens": prompt_tokens, "completion_tokens": u["completion_tokens"],
                     "total_tokens": prompt_tokens + u["completion_tokens"]}
    assert body[-1]["choices"][0]["finish_reason"] == "length"
    if include_usage:  # the closing usage-only chunk as before, with the final (engine) usage
        assert len(chunks) == len(body) + 1 and chunks[-1]["choices"] == []
        last = chunks[-1]["usage"]
        assert (last["prompt_tokens"], last["completion_tokens"], last["total_tokens"]) == \
            (prompt_tokens, 5, prompt_tokens + 5)
        assert set(last["prompt_tokens_details"]) == {"cached_tokens"}
    else:
        assert len(chunks) == len(body)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_without_continuous_usage_only_the_last_chunk_has_usage(http: httpx.Client, path: str) -> None:
    chunks = _stream(http, path, {"include_usage": True})
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    for options in (None, {"include_usage": False}, {"continuous_usage_stats": False}):
        assert all("usage" not in c for c in _stream(http, path, options))


def test_continuous_usage_sdk(client: openai.OpenAI) -> None:
    stream = client.completions.create(model=MODEL_NAME, prompt=[11, 12, 13], max_tokens=3, temperature=0,
                                       logprobs=0, stream=True, extra_body={"ignore_eos": True,
                                                                "stream_options": {"continuous_usage_stats": True}})
    chunks = list(stream)
    sent = list(itertools.accumulate(len(c.choices[0].logprobs.tokens) for c in chunks))
    assert [(c.usage.prompt_tokens, c.usage.completion_tokens) for c in chunks] == [(3, n) for n in sent]
    assert sent[-1] == 3


def test_a_stream_interval_sends_tokens_in_groups(start_server: Callable[..., RunningServer]) -> None:
    srv = start_server("native", engine_process=True, stream_interval=4)
    client = openai.OpenAI(base_url=srv.base_url, api_key="none")
    body = dict(model=MODEL_NAME, prompt=[11, 12, 13], max_tokens=11, temperature=0, logprobs=0,
                extra_body={"ignore_eos": True})
    whole = client.completions.create(**body)
    before = scrape(srv.url)
    chunks = list(client.completions.create(**body, stream=True))
    after = scrape(srv.url)
    per_chunk = [len(c.choices[0].logprobs.tokens) for c in chunks if c.choices[0].logprobs]
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text and sum(per_chunk) == 11
    # the engine handed the tokens over 4 times (the first, two groups of 4, the last 2): 3 gaps between them,
    # where every token its own hand-off makes 10 (the front end may merge further what waits; the metric is not)
    gaps = "trtllm_gateway_inter_token_latency_seconds_count"
    assert after[gaps] - before.get(gaps, 0.0) == 3


# ----- usage.prompt_tokens_details.cached_tokens -----

def test_cached_tokens_report_prefix_cache_hits(http: httpx.Client, backend_name: str) -> None:
    # 80 tokens = 5 blocks of 16 (kv_block_size in conftest) + 1: ids no other test sends, so the first is cold
    prompt = list(range(210, 290)) + [9]

    def usage(path: str, **body: object) -> dict:
        r = http.post(path, json={"model": MODEL_NAME, "max_tokens": 2, "temperature": 0, **body})
        assert r.status_code == 200, r.text
        return r.json()["usage"]

    first = usage("/v1/completions", prompt=prompt)
    assert first == {"prompt_tokens": 81, "completion_tokens": 2, "total_tokens": 83,
                     "prompt_tokens_details": {"cached_tokens": 0}}
    second = usage("/v1/completions", prompt=prompt)
    chat = usage("/v1/chat/completions", messages=MESSAGES)
    assert set(chat["prompt_tokens_details"]) == {"cached_tokens"}
    if backend_name != "native":
        pytest.skip("the fake tensorrt_llm has no KV cache to reuse (cached_tokens stays 0)")
    assert second["prompt_tokens_details"] == {"cached_tokens": 80}
