"""Behaviours both backends must show, over HTTP (issue 49 found the TensorRT-LLM backend wrong on each once its
fake followed the real TensorRT-LLM): n > 1 streaming, bad words, prompt logprobs, iteration stats during a long
request, and invalid requests answered 400 in both dialects (never 500).
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL_NAME, RunningServer, reference_greedy, scrape, wait_for
from tests.lora_adapters import make_peft_adapter
from tests.tiny_models import bannable_token

ITERATIONS = "trtllm_gateway_engine_iterations_total"
RUNNING = "trtllm_gateway_requests_running"


def test_n2_stream_equals_the_whole_answer(client: openai.OpenAI) -> None:
    args = dict(model=MODEL_NAME, prompt="A tiny model", max_tokens=6, temperature=1.0, seed=7, n=2, logprobs=1,
                extra_body={"ignore_eos": True})
    whole = client.completions.create(**args)
    chunks = list(client.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    texts: dict[int, str] = {}
    tokens: dict[int, list[str]] = {}
    finish: dict[int, str] = {}
    for chunk in chunks[:-1]:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            tokens.setdefault(c.index, []).extend(c.logprobs.tokens if c.logprobs else [])
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    for c in whole.choices:
        assert texts[c.index] == c.text and tokens[c.index] == c.logprobs.tokens and len(tokens[c.index]) == 6
    assert finish == {0: "length", 1: "length"}
    assert chunks[-1].usage == whole.usage and whole.usage.completion_tokens == 12


def test_bad_words_change_the_greedy_answer(http: httpx.Client, server: RunningServer, hf_model) -> None:
    tok = server.engine.tokenizer
    prompt = "The quick brown fox"
    free_ids, _ = reference_greedy(hf_model, tok.encode(prompt), 8)
    _, word = bannable_token(tok, free_ids)
    body = {"text_input": prompt, "max_tokens": 8, "end_id": -1, "return_log_probs": True,
            "exclude_input_in_output": True}
    free = http.post("/v2/models/ensemble/generate", json=body)
    banning = http.post("/v2/models/ensemble/generate", json={**body, "bad_words": [word]})
    assert free.status_code == banning.status_code == 200, banning.text
    assert free.json()["text_output"] == tok.decode(free_ids)
    assert banning.json()["text_output"] != free.json()["text_output"]
    assert len(banning.json()["output_log_probs"]) == 8


def test_prompt_logprobs_describe_each_prompt_token(client: openai.OpenAI, server: RunningServer, hf_model,
                                                    backend_name: str) -> None:
    """Exact on a prompt the model would write itself; on another, TensorRT-LLM 1.2 gives a token's logprob only
    when it is in its row's top-k (null otherwise)."""
    import torch

    tok = server.engine.tokenizer
    first = tok.encode("The")[:1]
    written = first + reference_greedy(hf_model, first, 6)[0]
    natural = tok.encode("The quick brown fox jumps")
    for ids in (written, natural):
        with torch.no_grad():
            ref = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)
        out = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=1, echo=True, logprobs=1,
                                        extra_body={"ignore_eos": True})
        got = out.choices[0].logprobs.token_logprobs[: len(ids)]
        assert got[0] is None
        for i in range(1, len(ids)):
            if got[i] is None:
                assert backend_name == "trtllm" and ids is natural and int(ref[i - 1].argmax()) != ids[i]
            else:
                assert got[i] == pytest.approx(float(ref[i - 1, ids[i]]), abs=1e-4)


def test_iteration_stats_advance_during_a_long_request(server: RunningServer) -> None:
    """240 tokens take well over one /metrics scrape on the tiny model; the stats must show the request
    running and the iterations counting while it runs, and every one of its iterations at the end."""
    before = scrape(server.url)[ITERATIONS]
    body = {"model": MODEL_NAME, "prompt": "hello", "max_tokens": 240, "temperature": 0, "ignore_eos": True,
            "stream": True}
    done = threading.Event()

    def consume() -> None:
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
            for _ in r.iter_lines():
                pass
        done.set()

    threading.Thread(target=consume, daemon=True).start()

    def seen_running() -> bool:
        m = scrape(server.url)
        assert not done.is_set(), "the request ended before the stats showed it"
        return m[RUNNING] == 1 and m[ITERATIONS] >= before + 10

    wait_for(seen_running, timeout=30, what="iteration stats of the running request")
    assert done.wait(60)
    wait_for(lambda: scrape(server.url)[ITERATIONS] >= before + 240, what="all 240 iterations")


def test_several_greedy_samples(client: openai.OpenAI, http: httpx.Client, backend_name: str) -> None:
    """TensorRT-LLM refuses several greedy samples (SamplingParams._validate): a 400 in both dialects there."""
    args = dict(model=MODEL_NAME, prompt="hi", max_tokens=3, temperature=0, n=2, extra_body={"ignore_eos": True})
    triton = http.post("/v2/models/ensemble/generate",
                       json={"text_input": "hi", "max_tokens": 3, "num_return_sequences": 2})
    if backend_name == "native":
        assert len({c.text for c in client.completions.create(**args).choices}) == 1
        assert triton.status_code == 200, triton.text
        return
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(**args)
    assert info.value.body["type"] == "invalid_request_error"
    assert "Greedy decoding in the LLM API does not allow multiple returns" in info.value.body["message"]
    assert triton.status_code == 400 and "Greedy decoding" in triton.json()["error"]


@pytest.mark.parametrize("backend", ["native", "trtllm"])
def test_an_adapter_folder_gone_since_start(start_server, tiny_model_dir: Path, tmp_path: Path,
                                            backend: str) -> None:
    """TensorRT-LLM reads an adapter's folder when its first request comes (LoRARequest checks it exists): a
    400 there in both dialects; the native engine loaded it at start."""
    adapter = make_peft_adapter(tiny_model_dir, tmp_path / "gone", ["q_proj", "v_proj"], r=4)
    server = start_server(backend, lora_modules={"gone": str(adapter)}, max_lora_rank=8)
    shutil.rmtree(adapter)
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    args = dict(model="gone", prompt="hi", max_tokens=2, temperature=0)
    triton = httpx.post(server.url + "/v2/models/ensemble/generate",
                        json={"text_input": "hi", "max_tokens": 2, "lora_task_id": 1}, timeout=60)
    if backend == "native":
        assert client.completions.create(**args).usage.completion_tokens == 2
        assert triton.status_code == 200, triton.text
        return
    with pytest.raises(openai.BadRequestError, match="does not exist"):
        client.completions.create(**args)
    assert triton.status_code == 400 and "does not exist" in triton.json()["error"]
