"""/v1/chat/completions through the official openai SDK (sync and async) against the real server."""

from __future__ import annotations

import openai
import pytest

from tests.e2e.conftest import MODEL_NAME, RunningServer, reference_greedy

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello"}]


def prompt_ids(server: RunningServer) -> list[int]:
    tok = server.engine.tokenizer
    return tok.encode(tok.apply_chat_template(MESSAGES), add_special_tokens=False)


def test_greedy_matches_transformers_with_logprobs_and_usage(client: openai.OpenAI, server: RunningServer,
                                                             hf_model) -> None:
    out = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_completion_tokens=5,
                                         temperature=0, logprobs=True, top_logprobs=3,
                                         extra_body={"ignore_eos": True})
    ids = prompt_ids(server)
    want_ids, want_lps = reference_greedy(hf_model, ids, 5)
    tok = server.engine.tokenizer
    choice = out.choices[0]
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant" and choice.message.content == tok.decode(want_ids)
    assert choice.finish_reason == "length"
    entries = choice.logprobs.content
    assert [e.token for e in entries] == [tok.token_text(t) for t in want_ids]
    assert [e.bytes for e in entries] == [tok.token_bytes(t) for t in want_ids]
    assert [e.logprob for e in entries] == pytest.approx(want_lps, abs=1e-4)
    assert all(len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token for e in entries)
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (len(ids), 5, len(ids) + 5)


def test_stream_role_first_finish_last_and_usage(client: openai.OpenAI) -> None:
    args = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    body = chunks[:-1]
    assert "".join(c.choices[0].delta.content or "" for c in body) == whole.choices[0].message.content
    assert body[-1].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_n2_seed_reproducible(client: openai.OpenAI) -> None:
    args = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=6, n=2, seed=7, temperature=1.0,
                extra_body={"ignore_eos": True})
    a = client.chat.completions.create(**args)
    b = client.chat.completions.create(**args)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert a.usage.completion_tokens == 12


def test_stop_string(client: openai.OpenAI) -> None:
    args = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    full = client.chat.completions.create(**args).choices[0].message.content
    stop = full[3:5]
    assert stop.strip(), f"degenerate output {full!r}"
    cut = client.chat.completions.create(**args, stop=stop).choices[0]
    assert cut.message.content == full[: full.index(stop)] and cut.finish_reason == "stop"


async def test_async_stream_n2(aclient: openai.AsyncOpenAI, backend_name: str) -> None:
    args = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=3, n=2, temperature=0, stream=True,
                extra_body={"ignore_eos": True})
    if backend_name == "trtllm":  # TensorRT-LLM refuses several greedy samples (SamplingParams._validate)
        with pytest.raises(openai.BadRequestError, match="Greedy decoding in the LLM API does not allow multiple"):
            await aclient.chat.completions.create(**args)
        return
    stream = await aclient.chat.completions.create(**args)
    texts = {0: "", 1: ""}
    finishes = {}
    async for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert texts[0] == texts[1] != "" and finishes == {0: "length", 1: "length"}


def test_logprobs_leave_out_the_stop_token(client: openai.OpenAI, server: RunningServer, hf_model) -> None:
    """OpenAI's logprobs cover the content: the token that stopped the answer (eos, a stop token id) has no entry,
    streamed or not, unless include_stop_str_in_output puts its text in the content."""
    want, _ = reference_greedy(hf_model, prompt_ids(server), 8)
    k = next(i for i in range(2, 8) if want[i] not in want[:i])
    tok = server.engine.tokenizer
    args = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True)
    body = {"ignore_eos": True, "stop_token_ids": [want[k]]}
    out = client.chat.completions.create(**args, extra_body=body)
    choice = out.choices[0]
    assert choice.finish_reason == "stop"
    assert [e.token for e in choice.logprobs.content] == [tok.token_text(t) for t in want[:k]]
    streamed = [e.token for c in client.chat.completions.create(**args, extra_body=body, stream=True)
                if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert streamed == [e.token for e in choice.logprobs.content]
    shown = client.chat.completions.create(**args, extra_body={**body, "include_stop_str_in_output": True})
    assert [e.token for e in shown.choices[0].logprobs.content] == [tok.token_text(t) for t in want[:k + 1]]


def test_a_request_without_max_tokens_stops_at_the_servers_default(start_server) -> None:
    """--default-max-tokens: chat and Responses requests that set no limit end there, cut ("length", incomplete)."""
    srv = start_server("native", default_max_tokens=5)
    sdk = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
    out = sdk.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert (out.usage.completion_tokens, out.choices[0].finish_reason) == (5, "length")
    r = sdk.responses.create(model=MODEL_NAME, input="Say hello", temperature=0, extra_body={"ignore_eos": True})
    assert (r.usage.output_tokens, r.status, r.max_output_tokens) == (5, "incomplete", None)
    longer = sdk.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=0, max_tokens=7,
                                         extra_body={"ignore_eos": True})
    assert longer.usage.completion_tokens == 7
