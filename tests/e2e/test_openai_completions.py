"""/v1/completions through the official openai SDK (sync and async) against the real server."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL_NAME, RunningServer, reference_greedy


def encode(server: RunningServer, text: str) -> list[int]:
    return server.engine.tokenizer.encode(text)


def test_greedy_matches_transformers_with_exact_usage(client: openai.OpenAI, server: RunningServer,
                                                      hf_model) -> None:
    prompt = "The quick brown fox"
    out = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=6, temperature=0,
                                    extra_body={"ignore_eos": True})
    ids = encode(server, prompt)
    want, _ = reference_greedy(hf_model, ids, 6)
    tok = server.engine.tokenizer
    assert out.object == "text_completion" and out.model == MODEL_NAME and out.id.startswith("cmpl-")
    assert out.choices[0].text == tok.decode(want)
    assert out.choices[0].finish_reason == "length" and out.choices[0].index == 0
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (len(ids), 6, len(ids) + 6)


def test_stream_equals_non_stream_and_include_usage(client: openai.OpenAI) -> None:
    args = dict(model=MODEL_NAME, prompt="Hello, world", max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**args)
    chunks = list(client.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    text_chunks, last = chunks[:-1], chunks[-1]
    assert "".join(c.choices[0].text for c in text_chunks) == whole.choices[0].text
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in text_chunks[:-1])
    assert last.choices == [] and last.usage == whole.usage


def _reference_top(hf_model, ids: list[int], k: int) -> list[list[tuple[int, float]]]:
    """transformers' top-k (id, logprob) at each greedy step after `ids`, best first."""
    import torch

    ids, out = list(ids), []
    with torch.no_grad():
        for _ in range(4):
            lp = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0, -1].float(), -1)
            values, top = torch.topk(lp, k)
            out.append([(int(i), float(v)) for i, v in zip(top, values)])
            ids.append(int(top[0]))
    return out


def test_logprobs_match_transformers(client: openai.OpenAI, server: RunningServer, hf_model) -> None:
    prompt = "the cat sat"
    out = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=4, temperature=0, logprobs=2,
                                    extra_body={"ignore_eos": True})
    prompt_ids = encode(server, prompt)
    want_ids, want_lps = reference_greedy(hf_model, prompt_ids, 4)
    lp = out.choices[0].logprobs
    tok = server.engine.tokenizer
    assert lp.tokens == [tok.token_text(t) for t in want_ids]
    assert lp.token_logprobs == pytest.approx(want_lps, abs=1e-4)
    # OpenAI keys top_logprobs by token text: ids rendering alike (byte tokens as '\ufffd') share one
    # key, held by the best-ranked of them. So compare against the reference top-2 keyed the same way.
    for token, top, ref in zip(lp.tokens, lp.top_logprobs, _reference_top(hf_model, prompt_ids, 2)):
        want: dict[str, float] = {}
        for token_id, logprob in ref:
            want.setdefault(tok.token_text(token_id), logprob)
        assert token in want  # greedy: the chosen token is the best, so it is in the top-2
        assert top.keys() == want.keys()
        assert list(top.values()) == pytest.approx(list(want.values()), abs=1e-4)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(4)]


def model_written_prompt(server: RunningServer, hf_model, n: int) -> list[int]:
    """A prompt the model would write itself (its greedy continuation of one token): each token tops its
    position's distribution, so TensorRT-LLM 1.2's top-k prompt logprobs hold it too."""
    first = encode(server, "The")[:1]
    return first + reference_greedy(hf_model, first, n - 1)[0]


def test_echo_with_logprobs_includes_the_prompt(client: openai.OpenAI, server: RunningServer, hf_model) -> None:
    ids = model_written_prompt(server, hf_model, 4)
    prompt = server.engine.tokenizer.decode(ids, skip_special_tokens=False)
    out = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=2, temperature=0, echo=True,
                                    logprobs=1, extra_body={"ignore_eos": True})
    choice = out.choices[0]
    assert choice.text.startswith(prompt)
    assert len(choice.logprobs.tokens) == len(ids) + 2
    assert choice.logprobs.token_logprobs[0] is None and choice.logprobs.top_logprobs[0] is None
    assert all(isinstance(x, float) for x in choice.logprobs.token_logprobs[1:])


def test_echo_with_max_tokens_0_scores_the_prompt(client: openai.OpenAI, server: RunningServer, hf_model) -> None:
    """lm-evaluation-harness's loglikelihood request: the prompt's logprobs (the first null), nothing generated.
    (A prompt the model would not write: see test_backend_behaviours.py for TensorRT-LLM 1.2's nulls there.)"""
    import torch

    ids = model_written_prompt(server, hf_model, 6)
    prompt = server.engine.tokenizer.decode(ids, skip_special_tokens=False)
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)
    want = [ref[i - 1, ids[i]].item() for i in range(1, len(ids))]
    for stream in (False, True):
        args = dict(model=MODEL_NAME, prompt=ids, max_tokens=0, echo=True, logprobs=1)
        if stream:
            chunks = list(client.completions.create(**args, stream=True, stream_options={"include_usage": True}))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            lps = [x for c in chunks if c.choices and c.choices[0].logprobs for x in c.choices[0].logprobs.token_logprobs]
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            usage = chunks[-1].usage
        else:
            out = client.completions.create(**args)
            text, lps, finish, usage = (out.choices[0].text, out.choices[0].logprobs.token_logprobs,
                                        out.choices[0].finish_reason, out.usage)
        assert text == prompt and finish == "length"
        assert lps[0] is None and lps[1:] == pytest.approx(want, abs=1e-4)
        assert (usage.prompt_tokens, usage.completion_tokens) == (len(ids), 0)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=0)
    assert err.value.body["param"] == "max_tokens"


def test_stop_string_cuts_the_text(client: openai.OpenAI) -> None:
    args = dict(model=MODEL_NAME, prompt="In the beginning", max_tokens=12, temperature=0,
                extra_body={"ignore_eos": True})
    full = client.completions.create(**args).choices[0].text
    stop = full[3:5]
    assert stop.strip(), f"degenerate output {full!r}"
    cut = client.completions.create(**args, stop=[stop]).choices[0]
    assert cut.text == full[: full.index(stop)] and cut.finish_reason == "stop"


def test_list_of_prompts_and_n_index_choices(client: openai.OpenAI, backend_name: str) -> None:
    prompts = ["the dog", "hello hello"]
    if backend_name == "trtllm":  # several greedy samples: refused (test_backend_behaviours.py)
        pytest.skip("TensorRT-LLM refuses n > 1 with greedy decoding")
    out = client.completions.create(model=MODEL_NAME, prompt=prompts, n=2, max_tokens=3, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    by_index = {c.index: c.text for c in out.choices}
    for i, p in enumerate(prompts):
        alone = client.completions.create(model=MODEL_NAME, prompt=p, max_tokens=3, temperature=0,
                                          extra_body={"ignore_eos": True}).choices[0].text
        assert by_index[2 * i] == by_index[2 * i + 1] == alone  # greedy: both samples agree
    assert out.usage.completion_tokens == 12


def test_seed_reproducible_and_n_samples_differ(client: openai.OpenAI) -> None:
    args = dict(model=MODEL_NAME, prompt="A tiny model", max_tokens=8, temperature=1.0, n=2, seed=1234,
                extra_body={"ignore_eos": True})
    a = client.completions.create(**args)
    b = client.completions.create(**args)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert a.choices[0].text != a.choices[1].text


def test_best_of_returns_the_samples_of_highest_cumulative_logprob(client: openai.OpenAI, http: httpx.Client) -> None:
    """best_of samples are generated (and billed), the n of highest summed token logprob returned best first, with
    logprobs only when asked; the same seed's n=best_of request shows every sample and its logprobs."""
    args = dict(model=MODEL_NAME, prompt=["A tiny model", "the cat"], max_tokens=6, temperature=1.0, seed=99,
                extra_body={"ignore_eos": True})
    every = client.completions.create(**args, n=4, logprobs=0)
    score = {c.index: sum(c.logprobs.token_logprobs) for c in every.choices}
    best = client.completions.create(**args, n=2, best_of=4)
    ranked = [sorted(range(4 * p, 4 * p + 4), key=lambda i: -score[i]) for p in (0, 1)]
    expected = [every.choices[i].text for best_of_prompt in ranked for i in best_of_prompt[:2]]
    assert [c.text for c in best.choices] == expected and [c.index for c in best.choices] == [0, 1, 2, 3]
    assert all(c.logprobs is None for c in best.choices)
    assert best.usage.completion_tokens == every.usage.completion_tokens == 2 * 4 * 6
    shown = client.completions.create(**args, n=1, best_of=4, logprobs=1)
    assert [c.text for c in shown.choices] == [expected[0], expected[2]]
    assert [sum(c.logprobs.token_logprobs) for c in shown.choices] == pytest.approx(
        [max(score[i] for i in range(4 * p, 4 * p + 4)) for p in (0, 1)], abs=1e-4)
    for body, message in (({"n": 3, "best_of": 2}, "best_of (2) must be at least n (3)"),
                          ({"best_of": 2, "stream": True},
                           "best_of greater than n cannot be streamed: the best are known at the end")):
        r = http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "hi", **body})
        assert r.status_code == 400 and r.json()["error"]["message"] == message
        assert r.json()["error"]["param"] == "best_of"


async def test_async_client_concurrent_streams(aclient: openai.AsyncOpenAI) -> None:
    async def one(prompt: str) -> str:
        stream = await aclient.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=4, temperature=0,
                                                  stream=True, extra_body={"ignore_eos": True})
        return "".join([c.choices[0].text async for c in stream])

    prompts = ["the cat", "the dog", "the mat"]
    streamed = await asyncio.gather(*(one(p) for p in prompts))
    for p, text in zip(prompts, streamed):
        whole = await aclient.completions.create(model=MODEL_NAME, prompt=p, max_tokens=4, temperature=0,
                                                 extra_body={"ignore_eos": True})
        assert whole.choices[0].text == text
