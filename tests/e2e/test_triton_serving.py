"""Triton's generate extension against the real server: the docs' example, every input and output,
generate_stream, errors; greedy text checked against transformers and the OpenAI endpoint."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import torch

from tests.e2e.conftest import MODEL_NAME, RunningServer, reference_greedy, scrape, wait_for

DOC_EXAMPLE = {"text_input": "What is machine learning?", "max_tokens": 20, "bad_words": "", "stop_words": ""}
PROMPT = "The quick brown fox"


def post(http: httpx.Client, model: str, body: dict[str, Any], endpoint: str = "generate") -> httpx.Response:
    return http.post(f"/v2/models/{model}/{endpoint}", json=body)


def events(response: httpx.Response) -> list[dict[str, Any]]:
    """The `data:` payloads of an SSE body, decoded."""
    assert response.headers["content-type"].startswith("text/event-stream")
    return [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]


def greedy_text(server: RunningServer, hf_model: Any, prompt: str, n: int) -> tuple[list[int], list[float], str]:
    """transformers' greedy continuation (no EOS stop): ids, logprobs, text."""
    ids, lps = reference_greedy(hf_model, server.engine.tokenizer.encode(prompt), n)
    return ids, lps, server.engine.tokenizer.decode(ids)


def test_documented_example_on_the_ensemble(http: httpx.Client) -> None:
    r = post(http, "ensemble", DOC_EXAMPLE)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"model_name", "model_version", "text_output", "cum_log_probs", "output_log_probs",
                         "sequence_end", "sequence_id", "sequence_start"}
    assert (body["model_name"], body["model_version"]) == ("ensemble", "1")
    assert (body["sequence_end"], body["sequence_id"], body["sequence_start"]) == (False, 0, False)
    assert body["text_output"].startswith(DOC_EXAMPLE["text_input"])  # exclude_input_in_output false
    assert body["cum_log_probs"] == 0.0  # not asked for: zeros, one per generated token
    assert body["output_log_probs"] == [0.0] * len(body["output_log_probs"]) and body["output_log_probs"]


@pytest.mark.parametrize("model", ["tensorrt_llm_bls", MODEL_NAME])
def test_bls_and_served_name_answer_like_the_ensemble(http: httpx.Client, model: str) -> None:
    ensemble = post(http, "ensemble", DOC_EXAMPLE).json()
    body = post(http, model, DOC_EXAMPLE).json()
    assert set(body) == {"model_name", "model_version", "text_output", "cum_log_probs", "output_log_probs"}
    assert body["model_name"] == model and body["text_output"] == ensemble["text_output"]
    again = http.post(f"/v2/models/{model}/versions/1/generate", json=DOC_EXAMPLE).json()
    assert again["text_output"] == body["text_output"]


def test_greedy_text_equals_transformers_and_the_openai_endpoint(http: httpx.Client, server: RunningServer,
                                                                  hf_model: Any) -> None:
    body = post(http, "ensemble", {"text_input": PROMPT, "max_tokens": 6, "end_id": -1,
                                   "exclude_input_in_output": True}).json()
    _, _, want = greedy_text(server, hf_model, PROMPT, 6)
    assert body["text_output"] == want
    openai = http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 6,
                                                "temperature": 0, "ignore_eos": True}).json()
    assert openai["choices"][0]["text"] == want
    # with the model's own end token too (the docs' example): same text as OpenAI's greedy completion
    doc = post(http, "ensemble", {**DOC_EXAMPLE, "exclude_input_in_output": True}).json()
    oa = http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": DOC_EXAMPLE["text_input"],
                                            "max_tokens": 20, "temperature": 0}).json()
    assert doc["text_output"] == oa["choices"][0]["text"]


def test_tensorrt_llm_takes_and_returns_token_ids(http: httpx.Client, server: RunningServer, hf_model: Any) -> None:
    ids = server.engine.tokenizer.encode(PROMPT)
    want, _ = reference_greedy(hf_model, ids, 5)
    body = post(http, "tensorrt_llm", {"input_ids": [ids], "input_lengths": [len(ids)], "request_output_len": [5],
                                       "end_id": -1}).json()
    assert body["model_name"] == "tensorrt_llm"
    assert body["output_ids"] == ids + want and body["sequence_length"] == len(ids) + 5
    excluded = post(http, "tensorrt_llm", {"input_ids": ids, "input_lengths": len(ids), "request_output_len": 5,
                                           "end_id": -1, "exclude_input_in_output": True}).json()
    assert excluded["output_ids"] == want and excluded["sequence_length"] == 5
    # a padded batch: input_lengths says how much of each row is prompt
    batch = post(http, "tensorrt_llm", {"input_ids": [ids, ids[:2] + [0] * (len(ids) - 2)],
                                        "input_lengths": [len(ids), 2], "request_output_len": 3,
                                        "end_id": -1}).json()
    assert [b["batch_index"] for b in batch] == [0, 1]
    assert batch[0]["output_ids"] == ids + want[:3]
    assert batch[1]["output_ids"][:2] == ids[:2] and batch[1]["sequence_length"] == 5


def test_log_probs(http: httpx.Client, server: RunningServer, hf_model: Any) -> None:
    _, lps, _ = greedy_text(server, hf_model, PROMPT, 4)
    body = post(http, "ensemble", {"text_input": PROMPT, "max_tokens": 4, "end_id": -1,
                                   "return_log_probs": True}).json()
    assert body["output_log_probs"] == pytest.approx(lps, abs=1e-4)
    assert body["cum_log_probs"] == pytest.approx(sum(lps), abs=1e-4)


def test_context_and_generation_logits_only_when_asked(http: httpx.Client, server: RunningServer,
                                                       backend_name: str, hf_model: Any) -> None:
    if backend_name != "native":
        pytest.skip("context/generation logits: native engine (the fake TensorRT-LLM does not compute them)")
    tok = server.engine.tokenizer
    ids = tok.encode(PROMPT)
    vocab = server.engine.model_info.vocab_size
    body = post(http, "ensemble", {"text_input": PROMPT, "max_tokens": 3, "end_id": -1,
                                   "return_context_logits": True, "return_generation_logits": True}).json()
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0].float()
    context = torch.tensor(body["context_logits"]).reshape(len(ids), vocab)
    assert torch.allclose(context, ref, atol=1e-4)
    generation = torch.tensor(body["generation_logits"]).reshape(3, vocab)
    want, _ = reference_greedy(hf_model, ids, 3)
    assert generation.argmax(-1).tolist() == want
    assert torch.allclose(generation[0], ref[-1], atol=1e-4)  # the first output's logits: the last prompt row
    plain = post(http, "ensemble", {"text_input": PROMPT, "max_tokens": 3}).json()
    assert "context_logits" not in plain and "generation_logits" not in plain


def test_batch_of_prompts_answers_one_object_per_prompt(http: httpx.Client) -> None:
    prompts = [PROMPT, "Hello there"]
    batch = post(http, "ensemble", {"text_input": prompts, "max_tokens": 4}).json()
    assert isinstance(batch, list) and [b["batch_index"] for b in batch] == [0, 1]
    for prompt, answer in zip(prompts, batch):
        single = post(http, "ensemble", {"text_input": prompt, "max_tokens": 4}).json()
        assert answer["text_output"] == single["text_output"] and "batch_index" not in single


def test_every_sampling_input_is_accepted_and_honoured(http: httpx.Client) -> None:
    body = {"text_input": PROMPT, "max_tokens": 5, "temperature": 0.8, "top_k": 20, "top_p": 0.9,
            "len_penalty": 1.0, "repetition_penalty": 1.1, "min_length": 5, "presence_penalty": 0.1,
            "frequency_penalty": 0.1, "random_seed": 7, "pad_id": 0, "end_id": 2, "bad_words": ["zz"],
            "stop_words": [""], "embedding_bias_words": ["the"], "embedding_bias_weights": [0.5],
            "return_log_probs": True, "beam_width": 1, "stream": False}
    first = post(http, "ensemble", body)
    assert first.status_code == 200, first.text
    out = first.json()
    assert len(out["output_log_probs"]) == 5  # min_length 5 = max_tokens: no early stop
    assert post(http, "ensemble", body).json()["text_output"] == out["text_output"]  # same seed, same text
    # as one-element lists, and inside `parameters`
    listed = {k: ([v] if not isinstance(v, list) else v) for k, v in body.items() if k != "text_input"}
    again = post(http, "ensemble", {"text_input": [PROMPT], "parameters": {"max_tokens": 5},
                                    **{k: v for k, v in listed.items() if k != "max_tokens"}}).json()
    assert again["text_output"] == out["text_output"]  # a one-element text_input list is one prompt


def test_stop_words_end_the_text_after_the_word(http: httpx.Client) -> None:
    free = post(http, "ensemble", {"text_input": PROMPT, "max_tokens": 12, "end_id": -1,
                                   "exclude_input_in_output": True}).json()["text_output"]
    word = free[3:5]
    assert word.strip(), f"completion too short to pick a stop word from: {free!r}"
    stopped = post(http, "ensemble", {"text_input": PROMPT, "max_tokens": 12, "end_id": -1, "stop_words": [word],
                                      "exclude_input_in_output": True}).json()["text_output"]
    assert stopped == free[: free.index(word) + len(word)]


def test_temperature_sampling_depends_on_the_seed(http: httpx.Client) -> None:
    base = {"text_input": PROMPT, "max_tokens": 8, "end_id": -1, "top_k": 0, "top_p": 1.0, "temperature": 5.0}
    texts = {post(http, "ensemble", {**base, "random_seed": s}).json()["text_output"] for s in range(4)}
    assert len(texts) > 1
    assert post(http, "ensemble", {**base, "random_seed": 1}).json()["text_output"] == \
        post(http, "ensemble", {**base, "random_seed": 1}).json()["text_output"]


def test_beam_search_matches_transformers(http: httpx.Client, server: RunningServer, backend_name: str,
                                          hf_model: Any) -> None:
    if backend_name != "native":
        pytest.skip("the fake tensorrt_llm does not implement beam search")
    ids = server.engine.tokenizer.encode(PROMPT)
    r = post(http, "tensorrt_llm", {"input_ids": ids, "input_lengths": len(ids), "request_output_len": 3,
                                    "end_id": -1, "beam_width": 2, "return_log_probs": True})
    assert r.status_code == 200, r.text
    body = r.json()
    with torch.no_grad():
        ref = hf_model.generate(torch.tensor([ids]), num_beams=2, num_return_sequences=2, max_new_tokens=3,
                                do_sample=False, early_stopping=False, eos_token_id=None, pad_token_id=0,
                                output_scores=True, return_dict_in_generate=True)
    assert body["output_ids"] == [t for row in ref.sequences.tolist() for t in row]  # both beams, best first
    assert body["sequence_length"] == [len(ids) + 3] * 2
    # transformers' beam score is the summed logprob / generated length (length_penalty 1)
    assert [c / 3 for c in body["cum_log_probs"]] == pytest.approx(ref.sequences_scores.tolist(), abs=1e-4)
    assert len(body["output_log_probs"]) == 2 * 3
    text = post(http, "ensemble", {"text_input": PROMPT, "max_tokens": 3, "end_id": -1, "beam_width": 2,
                                   "exclude_input_in_output": True}).json()
    tok = server.engine.tokenizer
    assert text["text_output"] == [tok.decode(row[len(ids):]) for row in ref.sequences.tolist()]


def test_generate_stream_streams_the_same_text(http: httpx.Client) -> None:
    full = post(http, "ensemble", {**DOC_EXAMPLE, "exclude_input_in_output": True}).json()
    r = post(http, "ensemble", {**DOC_EXAMPLE, "stream": True, "return_log_probs": True}, "generate_stream")
    assert r.status_code == 200
    chunks = events(r)
    # an event per token (a list of several where tokens waited together), as Triton's one-element outputs
    per_event = [lp if isinstance(lp, list) else [lp] for lp in (c["output_log_probs"] for c in chunks)]
    assert sum(map(len, per_event)) == len(full["output_log_probs"])  # one log prob per generated token
    assert "".join(c["text_output"] for c in chunks) == full["text_output"]  # never repeats the prompt
    assert all(c["model_name"] == "ensemble" and c["sequence_id"] == 0 for c in chunks)
    running = 0.0
    for c, lps in zip(chunks, per_event, strict=True):
        running += sum(lps)
        assert c["cum_log_probs"] == pytest.approx(running, abs=1e-4)
    bls = events(post(http, "tensorrt_llm_bls", {**DOC_EXAMPLE, "stream": True}, "generate_stream"))
    assert "".join(c["text_output"] for c in bls) == full["text_output"]


def test_generate_stream_without_stream_sends_the_complete_answer(http: httpx.Client) -> None:
    full = post(http, "ensemble", DOC_EXAMPLE).json()
    chunks = events(post(http, "ensemble", DOC_EXAMPLE, "generate_stream"))
    assert chunks == [full]


def test_errors(http: httpx.Client) -> None:
    r = post(http, "ensemble", {**DOC_EXAMPLE, "foo": 1, "parameters": {"bar": 2}})
    assert r.status_code == 400
    assert r.json() == {"error": "unexpected inference inputs 'bar', 'foo' for model 'ensemble'"}
    r = post(http, "nope", DOC_EXAMPLE)
    assert (r.status_code, r.json()) == (404, {"error": "Request for unknown model: 'nope' is not found"})
    r = http.post("/v2/models/ensemble/versions/3/generate", json=DOC_EXAMPLE)
    assert r.status_code == 404 and "version 3" in r.json()["error"]
    r = post(http, "ensemble", {"text_input": "x"})
    assert (r.status_code, r.json()) == (400, {"error": "missing required input 'max_tokens' for model 'ensemble'"})
    r = http.post("/v2/models/ensemble/generate", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"].startswith("failed to parse the request JSON buffer: ")
    # a rejection before the first event is a plain JSON error, also on generate_stream
    r = post(http, "ensemble", {"text_input": "a " * 5000, "max_tokens": 5, "stream": True}, "generate_stream")
    assert r.status_code == 400 and "maximum context length" in r.json()["error"]
    r = post(http, "ensemble", {**DOC_EXAMPLE, "beam_width": 64})
    assert r.status_code == 400 and "beam_width" in r.json()["error"]


def test_client_disconnect_mid_stream_aborts_the_request(server: RunningServer) -> None:
    room = server.engine.model_info.context_window - len(server.engine.tokenizer.encode(PROMPT))
    body = {"text_input": PROMPT, "max_tokens": room, "end_id": -1, "stream": True}
    key = "nv_inference_request_failure_total{model=tensorrt_llm_bls,version=1}"  # the parser's counter name
    failures = scrape(server.url).get(key, 0.0)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        with client.stream("POST", "/v2/models/tensorrt_llm_bls/generate_stream", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
    # the engine frees the request (its KV blocks return to the pool) and Triton's counters book a failure
    wait_for(lambda: server.engine.stats().running == 0 and server.engine.stats().waiting == 0,
             what="the aborted request to leave the engine")
    wait_for(lambda: scrape(server.url).get(key, 0.0) == failures + 1, what="the failure to be counted")
