"""The plain-dict stream chunks (adapters/openai/responses.py) are the models' JSON, key order included,
and the SSE writer's JSON is the compact JSON the stdlib writes."""

from __future__ import annotations

import json

import pytest

from adapters.openai.responses import (
    ChatChoiceLogprobs,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatDelta,
    ChatTokenLogprob,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    TopLogprob,
    chat_chunk_choice,
    completion_chunk_choice,
    stream_chunk,
)
from gateway.streaming import encode_event, json_bytes


def _same(a: dict, b: dict) -> None:
    assert json.dumps(a) == json.dumps(b)  # equal and in the same key order


@pytest.mark.parametrize("logprobs", [None, CompletionLogprobs(tokens=["a"], token_logprobs=[-0.5],
                                                               top_logprobs=[{"a": -0.5}], text_offset=[3])])
@pytest.mark.parametrize("finish", [None, "length"])
@pytest.mark.parametrize("usage_null", [False, True])
def test_completion_chunk_is_the_models_dump(logprobs: CompletionLogprobs | None, finish: str | None,
                                             usage_null: bool) -> None:
    want = Completion(id="cmpl-1", created=7, model="m",
                      choices=[CompletionChoice(index=2, text=" hi", logprobs=logprobs, finish_reason=finish)]).model_dump()
    if usage_null:
        want["usage"] = None
    got = stream_chunk("text_completion", "cmpl-1", 7, "m", completion_chunk_choice(2, " hi", logprobs, finish), usage_null)
    _same(got, want)


_LP = ChatChoiceLogprobs(content=[ChatTokenLogprob(token="a", logprob=-1.5, bytes=[97],
                                                   top_logprobs=[TopLogprob(token="b", logprob=-2.0, bytes=[98])])])


@pytest.mark.parametrize("fields", [
    {"role": "assistant", "content": ""},
    {"content": "hi"},
    {"content": "hi", "logprobs": _LP},
    {"finish_reason": "stop"},
    {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                     "function": {"name": "f", "arguments": "{}"}}], "finish_reason": "tool_calls"},
])
@pytest.mark.parametrize("usage_null", [False, True])
def test_chat_chunk_is_the_models_dump(fields: dict, usage_null: bool) -> None:
    delta = ChatDelta(**{k: v for k, v in fields.items() if k in ("role", "content", "tool_calls")})
    choice = ChatChunkChoice(index=1, delta=delta, logprobs=fields.get("logprobs"),
                             finish_reason=fields.get("finish_reason"))
    want = ChatCompletionChunk(id="chatcmpl-1", created=7, model="m", choices=[choice]).model_dump()
    if usage_null:
        want["usage"] = None
    got = stream_chunk("chat.completion.chunk", "chatcmpl-1", 7, "m", chat_chunk_choice(1, **fields), usage_null)
    _same(got, want)


def test_event_json_is_compact_stdlib_json() -> None:
    payload = {"text": "é😀 \u2028 \"q\" \\ \x00 \n", "n": -3, "x": None, "ok": True, "f": 0.25, "l": [1, 2]}
    assert json_bytes(payload).decode() == json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    assert encode_event(payload) == b"data: " + json_bytes(payload) + b"\n\n"
    assert encode_event("[DONE]") == b"data: [DONE]\n\n"


def test_what_orjson_refuses_is_still_written() -> None:
    payload = {"text": "é \ud800", "big": 2**70}  # a lone surrogate, an integer over 64 bits
    assert json_bytes(payload) == b'{"text":"\\u00e9 \\ud800","big":1180591620717411303424}'
