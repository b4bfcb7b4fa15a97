"""gpt-oss's harmony format through the real server: a tiny random gpt-oss checkpoint with gpt-oss's published
chat template and harmony's special tokens (tests/unit/chat_templates/), asked with tool_choice "required" (the
grammar writes the harmony call message), answers with an OpenAI tool call on /v1/chat/completions (whole and
streamed) and /v1/responses, through the official SDK. (The random model spells most markers out in plain
tokens where the grammar lets it; the text, and so what the client gets, is the same.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.chat_families import HARMONY_TOKENS, published_template
from tests.e2e.conftest import MODEL_NAME, RunningServer, launch
from tests.tiny_models import build_tiny_model

CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather of a city",
                                           "parameters": CITY}}]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny gpt-oss, its vocabulary grown by harmony's special tokens; <|call|> and <|return|> end a turn."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # its system prompt alone is ~450 tokens of the tiny byte-level vocabulary
    folder = build_tiny_model(tmp_path_factory.mktemp("harmony-e2e"), "gpt_oss", max_position_embeddings=1024)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_tokens(HARMONY_TOKENS, special_tokens=True)
    tokenizer.chat_template = published_template("gpt-oss")
    model = AutoModelForCausalLM.from_pretrained(folder)
    model.resize_token_embeddings(len(tokenizer))
    ends = tokenizer.convert_tokens_to_ids(["<|return|>", "<|call|>"])
    model.generation_config.eos_token_id = [*model.generation_config.eos_token_id, *ends]
    out = folder.parent / "tiny-gpt-oss-harmony"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def client(gpt_oss: Path) -> Iterator[openai.OpenAI]:
    srv: RunningServer = launch(gpt_oss, "native")
    yield openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
    srv.stop()


def test_a_forced_call_comes_back_as_a_tool_call_whole_and_streamed(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                           temperature=0, max_tokens=200)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", reply.model_dump_json()
    assert choice.message.content is None
    [call] = choice.message.tool_calls or []
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Rome")

    stream = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                            temperature=0, max_tokens=200, stream=True)
    chunks = list(stream)
    deltas = [t for c in chunks for t in c.choices[0].delta.tool_calls or []]
    assert deltas[0].id and deltas[0].function.name == "get_weather"
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
    assert not any(c.choices[0].delta.content for c in chunks)  # no harmony markup leaks as text
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_forced_call_is_a_function_call_item_of_a_response(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL_NAME, input="Weather in Paris?", temperature=0,
                                       max_output_tokens=200, tool_choice="required",
                                       tools=[{"type": "function", "name": "get_weather", "parameters": CITY,
                                               "description": "The weather of a city"}])
    [item] = response.output
    assert item.type == "function_call" and item.name == "get_weather"
    assert json.loads(item.arguments)["city"] in ("Paris", "Rome")

