"""The TensorRT-LLM backend (on the fake tensorrt_llm) over HTTP: an option it cannot honour is a 400
naming the option and the backend, in the OpenAI error shape; the same option the engine does honour passes."""

from __future__ import annotations

import openai
import pytest

from tests.e2e.conftest import MODEL_NAME


def test_unsupported_option_is_a_clear_400(start_server) -> None:
    server = start_server("trtllm")
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2, extra_body={"num_draft_tokens": 3})
    error = info.value.body
    assert error["param"] == "num_draft_tokens"
    assert error["message"].startswith("'num_draft_tokens' is not supported by the trtllm backend")
    # 0 draft tokens is what this engine (no speculation) does anyway: accepted.
    out = client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2, temperature=0,
                                    extra_body={"num_draft_tokens": 0, "ignore_eos": True})
    assert out.usage.completion_tokens == 2 and out.choices[0].finish_reason == "length"
