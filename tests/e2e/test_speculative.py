"""Speculative decoding end to end: a native server with --speculative draft (the draft is the tiny model
itself, so proposals are accepted), one with --speculative ngram and one with --speculative eagle give transformers' exact greedy
tokens through the openai SDK (plain and streamed), per-request `num_draft_tokens` (OpenAI extra body,
Triton input) changes nothing in the output, and /metrics reports the speculation counters."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gateway.settings import Settings
from runtime.config import EngineConfig
from tests.e2e.conftest import DEFAULT_ENGINE_OPTIONS, MODEL_NAME, RunningServer, free_port, reference_greedy, scrape
from tests.unit.test_spec_eagle import write_head

PROMPTS = [[40, 41, 42, 43, 40, 41, 42], [7, 99, 120, 7, 99, 5, 250, 31]]


@pytest.fixture(scope="module", params=["draft", "ngram", "eagle"])
def spec_server(request: pytest.FixtureRequest, tiny_model_dir: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    extra = {"draft_model": str(tiny_model_dir)} if request.param == "draft" else {}
    if request.param == "eagle":  # an untrained head shaped for the tiny model (tests/unit/test_spec_eagle.py)
        extra = {"draft_model": write_head(tmp_path_factory.mktemp("eagle"), 64, 4, 2, 16, 10000.0)}
    engine = EngineConfig(**{**DEFAULT_ENGINE_OPTIONS, "model": str(tiny_model_dir)}, speculative=request.param,
                          num_draft_tokens=3, **extra)
    srv = RunningServer(Settings(grpc_port=None, host="127.0.0.1", port=free_port(), drain_timeout=0.0, engine=engine)).start()
    yield srv
    srv.stop()


def test_greedy_completions_equal_transformers_with_and_without_speculation(spec_server, hf_model) -> None:
    client = openai.OpenAI(base_url=spec_server.base_url, api_key="x")
    for prompt in PROMPTS:
        want, _ = reference_greedy(hf_model, prompt, 16)
        for extra in ({}, {"num_draft_tokens": 0}, {"num_draft_tokens": 5}):
            r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=16, temperature=0,
                                          logprobs=0, extra_body={"ignore_eos": True, **extra})
            text = r.choices[0].text
            assert r.usage.completion_tokens == 16
            assert text == spec_server.engine.tokenizer.decode(want), extra
        chunks = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=16, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        assert "".join(c.choices[0].text for c in chunks if c.choices) == spec_server.engine.tokenizer.decode(want)


def test_triton_num_draft_tokens_input_keeps_the_output(spec_server) -> None:
    url = f"{spec_server.url}/v2/models/ensemble/generate"
    body = {"text_input": "the cat sat on the mat and the cat", "max_tokens": 12, "temperature": 0.0}
    outs = [httpx.post(url, json={**body, **extra}, timeout=60) for extra in
            ({}, {"num_draft_tokens": 0}, {"num_draft_tokens": 2, "use_draft_logits": True})]
    assert all(r.status_code == 200 for r in outs), [r.text for r in outs]
    assert len({r.json()["text_output"] for r in outs}) == 1


def test_metrics_report_speculation(spec_server) -> None:
    client = openai.OpenAI(base_url=spec_server.base_url, api_key="x")
    client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0] * 3, max_tokens=12, temperature=0,
                              extra_body={"ignore_eos": True})
    m = scrape(spec_server.url)
    proposed = m["trtllm_gateway_spec_draft_tokens_total"]
    accepted = m["trtllm_gateway_spec_accepted_tokens_total"]
    assert proposed > 0 and 0 <= accepted <= proposed
    assert m["trtllm_gateway_spec_acceptance_rate"] == pytest.approx(accepted / proposed)
    assert m["trtllm_gateway_spec_mean_accepted_length"] == pytest.approx(
        accepted / m["trtllm_gateway_spec_steps_total"])
    if spec_server.settings.engine.speculative == "draft":  # the draft is the target itself
        assert accepted == proposed
