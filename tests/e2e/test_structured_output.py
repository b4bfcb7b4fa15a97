"""response_format end to end: the openai SDK's parse(), streaming, langchain's with_structured_output.

The tiny model is random, so only grammar-constrained decoding can make its answers parse. Schemas bound
their strings and numbers, and the grammar writes compact JSON, so every answer ends by itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Literal

import httpx
import openai
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from tests.e2e.conftest import MODEL_NAME, RunningServer, launch
from tests.tiny_models import build_tiny_model


class Pet(BaseModel):
    name: str = Field(max_length=8)
    species: Literal["cat", "dog", "fish"]
    age: int = Field(ge=0, le=30)
    vaccinated: bool


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The tiny model with room for the tool prompt its template gets from us (about 1,000 tokens; LangChain's
    function_calling method sends a tool)."""
    model = build_tiny_model(tmp_path_factory.mktemp("structured"), "llama", max_position_embeddings=2048)
    srv = launch(model, "native", max_num_tokens=2048, max_kv_tokens=16384)
    yield srv
    srv.stop()


@pytest.fixture
def client(native: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=native.base_url, api_key="unused", max_retries=0)


MESSAGES = [{"role": "user", "content": "Describe a pet."}]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sdk_parse_returns_the_pydantic_object(client: openai.OpenAI, temperature: float) -> None:
    completion = client.chat.completions.parse(model=MODEL_NAME, messages=MESSAGES, response_format=Pet,
                                               temperature=temperature, seed=3, max_tokens=200)
    choice = completion.choices[0]
    assert isinstance(choice.message.parsed, Pet)
    assert choice.message.parsed == Pet.model_validate_json(choice.message.content)
    assert choice.finish_reason == "stop"
    again = client.chat.completions.parse(model=MODEL_NAME, messages=MESSAGES, response_format=Pet,
                                          temperature=temperature, seed=3, max_tokens=200)
    assert again.choices[0].message.parsed == choice.message.parsed  # seeded: the grammar adds no randomness


def test_streamed_json_schema_parses(client: openai.OpenAI) -> None:
    schema = Pet.model_json_schema()
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, stream=True, temperature=1.0, seed=11, max_tokens=200,
        response_format={"type": "json_schema", "json_schema": {"name": "pet", "schema": schema, "strict": True}})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    Pet.model_validate_json(text)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_json_object_is_one_json_object(client: openai.OpenAI) -> None:
    # A random model may wander inside an unbounded object; what it wrote must still be a JSON object
    # or a prefix of one, and a finished answer must parse.
    reply = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=0.0, max_tokens=60,
                                           response_format={"type": "json_object"})
    text, finish = reply.choices[0].message.content, reply.choices[0].finish_reason
    assert text.startswith("{")
    if finish == "stop":
        assert isinstance(json.loads(text), dict)


def test_unsupported_schema_features_are_a_400_naming_them(native: RunningServer) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}},
              "patternProperties": {"^x": {"type": "integer"}}, "if": {"required": ["a"]}}
    r = httpx.post(f"{native.url}/v1/chat/completions", json={
        "model": MODEL_NAME, "messages": MESSAGES,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["message"] == ("The JSON schema uses features that constrained decoding does not support: "
                              "'patternProperties' at #, 'if' at #")
    assert err["param"] == "response_format" and err["type"] == "invalid_request_error"


def test_json_schema_without_schema_member_is_a_400(native: RunningServer) -> None:
    r = httpx.post(f"{native.url}/v1/chat/completions", json={
        "model": MODEL_NAME, "messages": MESSAGES, "response_format": {"type": "json_schema"}})
    assert r.status_code == 400
    assert "json_schema" in r.json()["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_schema_the_grammar_compiler_rejects_is_a_400(native: RunningServer, stream: bool) -> None:
    r = httpx.post(f"{native.url}/v1/chat/completions", json={
        "model": MODEL_NAME, "messages": MESSAGES, "stream": stream,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "colour"}}}})
    assert r.status_code == 400
    assert r.json() == {"error": {"message": 'invalid json_schema constraint: Unsupported type "colour"',
                                  "type": "invalid_request_error", "param": "response_format", "code": None}}


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output_returns_the_model(native: RunningServer, method: str) -> None:
    llm = ChatOpenAI(base_url=native.base_url, api_key="unused", model=MODEL_NAME, temperature=0, max_tokens=200,
                     max_retries=0)
    pet = llm.with_structured_output(Pet, method=method).invoke("Describe a pet.")
    assert isinstance(pet, Pet)


def test_triton_guided_decoding_input_takes_a_json_schema(native: RunningServer) -> None:
    body = {"text_input": "Describe a pet.", "max_tokens": 200, "temperature": 0.0, "exclude_input_in_output": True,
            "guided_decoding": json.dumps(Pet.model_json_schema())}
    r = httpx.post(f"{native.url}/v2/models/ensemble/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    pet = Pet.model_validate_json(r.json()["text_output"])
    streamed = httpx.post(f"{native.url}/v2/models/ensemble/generate_stream", json={**body, "stream": True}, timeout=60)
    events = [json.loads(line[5:]) for line in streamed.text.splitlines() if line.startswith("data:")]
    assert len(events) > 1 and Pet.model_validate_json("".join(e["text_output"] for e in events)) == pet  # greedy
    both = httpx.post(f"{native.url}/v2/models/ensemble/generate",
                      json={**body, "guided_decoding_guide_type": "json"}, timeout=60)
    assert both.status_code == 400
    assert both.json() == {"error": "give either 'guided_decoding' or 'guided_decoding_guide_type'/"
                                    "'guided_decoding_guide', not both"}
    unsupported = httpx.post(f"{native.url}/v2/models/ensemble/generate",
                             json={**body, "guided_decoding": json.dumps({"type": "array", "uniqueItems": True})})
    assert unsupported.status_code == 400
    assert unsupported.json() == {"error": "The JSON schema uses features that constrained decoding does not support: "
                                           "'uniqueItems' at #"}



PET_FORMAT = {"type": "json_schema", "json_schema": {"name": "pet", "schema": Pet.model_json_schema(), "strict": True}}


@pytest.mark.parametrize("extra", [{"ignore_eos": True}, {"min_tokens": 150}])
def test_a_complete_grammar_ends_the_answer_whatever_ignore_eos_or_min_tokens_say(client: openai.OpenAI,
                                                                                  extra: dict[str, object]) -> None:
    # Before: the grammar's end token was ignored and the model went on unconstrained up to max_tokens.
    completion = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=0.0, max_tokens=200,
                                                response_format=PET_FORMAT, extra_body=extra)
    choice = completion.choices[0]
    Pet.model_validate_json(choice.message.content)
    assert choice.finish_reason == "stop" and completion.usage.completion_tokens < 150


@pytest.mark.parametrize("extra", [{"end_id": -1}, {"min_length": 150}])
def test_triton_guided_answer_ends_with_its_grammar_whatever_end_id_or_min_length_say(
        native: RunningServer, extra: dict[str, int]) -> None:
    body = {"text_input": "Describe a pet.", "max_tokens": 200, "temperature": 0.0, "exclude_input_in_output": True,
            "guided_decoding": json.dumps(Pet.model_json_schema())}
    r = httpx.post(f"{native.url}/v2/models/ensemble/generate", json={**body, **extra}, timeout=60)
    assert r.status_code == 200, r.text
    plain = httpx.post(f"{native.url}/v2/models/ensemble/generate", json=body, timeout=60).json()["text_output"]
    assert Pet.model_validate_json(r.json()["text_output"]) == Pet.model_validate_json(plain)  # greedy: the same answer


def test_a_schema_too_large_to_compile_is_a_quick_400(native: RunningServer) -> None:
    # Before: compiled for ~10 s per request (39 s on a loaded box), kept 246 MiB in the grammar cache.
    schema = {"type": "object", "properties": {"v": {"enum": [f"value-{i:06d}" for i in range(100_000)]}},
              "required": ["v"]}
    message = "The guided decoding constraint is too large to compile: longer than 65536 characters."
    start = time.monotonic()
    r = httpx.post(f"{native.url}/v1/chat/completions", timeout=60, json={
        "model": MODEL_NAME, "messages": MESSAGES,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    assert r.status_code == 400 and time.monotonic() - start < 5
    assert r.json()["error"] | {"message": message, "param": "response_format"} == r.json()["error"]
    triton = httpx.post(f"{native.url}/v2/models/ensemble/generate", timeout=60, json={
        "text_input": "Describe a pet.", "max_tokens": 20, "guided_decoding": json.dumps(schema)})
    assert triton.status_code == 400 and triton.json() == {"error": message}
