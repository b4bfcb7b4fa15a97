"""Guided decoding inside NativeEngine: valid JSON from a random model, batch isolation, errors."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from pydantic import BaseModel, Field

from runtime.config import EngineConfig
from runtime.errors import EngineNotReadyError, InvalidRequestError, UnsupportedOptionError
from runtime.native.llm_engine import NativeEngine
from runtime.request import GenerationRequest, GuidedDecoding, SamplingOptions
from tests.engine_harness import collect, hf_greedy, load_hf, request, running_engine
from tests.tiny_models import build_tiny_model


class Person(BaseModel):
    name: str = Field(max_length=6)
    age: int = Field(ge=0, le=120)
    member: bool
    color: str = Field(json_schema_extra={"enum": ["red", "green", "blue"]})


SCHEMA = Person.model_json_schema()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    path = build_tiny_model(tmp_path_factory.mktemp("guided"), "llama")
    return path, load_hf(path)


def guided_request(rid: str, prompt: list[int], guided: GuidedDecoding, **sampling) -> GenerationRequest:
    sampling.setdefault("max_tokens", 200)
    return GenerationRequest(rid, prompt_token_ids=prompt, sampling=SamplingOptions(**sampling), guided=guided)


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 1.0, "seed": 7},
                                      {"temperature": 1.0, "seed": 8, "n": 3}])
async def test_json_schema_output_validates_and_stops_on_eos(model, sampling) -> None:
    path, _ = model
    async with running_engine(path) as engine:
        out = await collect(engine, guided_request("g", [5, 6, 7], GuidedDecoding(json_schema=SCHEMA), **sampling))
    for index in range(sampling.get("n", 1)):
        Person.model_validate_json(out.text[index])  # raises if the grammar let anything else through
        assert out.finish[index] == "stop" and out.stop_reason[index] is None  # ended by eos, not length
        assert out.tokens[index][-1] in engine.eos_token_ids


async def test_constrained_rows_leave_unconstrained_greedy_ids_unchanged(model) -> None:
    path, hf = model
    prompts = [[3 + i, 40 + 7 * i, 90 + i] for i in range(6)]
    async with running_engine(path, max_kv_tokens=4096) as engine:  # room for all 12 at once: one batch
        free = [request(f"free{i}", p, 24) for i, p in enumerate(prompts)]
        bound = [guided_request(f"bound{i}", p, GuidedDecoding(json_schema=SCHEMA), temperature=0.0)
                 for i, p in enumerate(prompts)]
        mixed = [r for pair in zip(free, bound) for r in pair]
        outs = await asyncio.gather(*(collect(engine, r) for r in mixed))
    for i, p in enumerate(prompts):
        assert outs[2 * i].tokens[0] == hf_greedy(hf, p, 24)
        Person.model_validate_json(outs[2 * i + 1].text[0])


async def test_json_object_and_regex(model) -> None:
    path, _ = model
    async with running_engine(path) as engine:
        out = await collect(engine, guided_request("r", [9, 9], GuidedDecoding(regex=r"(yes|no)-[0-9]{2}"),
                                                   temperature=0.0))
        assert out.finish[0] == "stop"
        assert out.text[0][:-2] in ("yes-", "no-") and out.text[0][-2:].isdigit()
        # an unbounded object may run to max_tokens: what was written is then a prefix of one
        out = await collect(engine, guided_request("o", [9, 9], GuidedDecoding(json_object=True), temperature=0.0,
                                                   max_tokens=40))
    assert out.text[0].startswith("{")
    if out.finish[0] == "stop":
        assert isinstance(json.loads(out.text[0]), dict)


async def test_unsupported_schema_features_are_named(model) -> None:
    path, _ = model
    schema = {"type": "object", "properties": {"a": {"not": {"type": "string"}},
                                               "b": {"type": "integer", "multipleOf": 3}}}
    async with running_engine(path) as engine:
        with pytest.raises(InvalidRequestError) as info:
            await collect(engine, guided_request("u", [1, 2], GuidedDecoding(json_schema=schema)))
        assert str(info.value) == ("The JSON schema uses features that constrained decoding does not support: "
                                   "'not' at #/properties/a, 'multipleOf' at #/properties/b")
        with pytest.raises(InvalidRequestError, match="invalid regex constraint"):
            await collect(engine, guided_request("v", [1, 2], GuidedDecoding(regex="(unclosed")))
        with pytest.raises(UnsupportedOptionError, match="beam search"):
            await collect(engine, guided_request("w", [1, 2], GuidedDecoding(json_object=True), beam_width=2,
                                                 temperature=0.0))
        assert engine._guides().misses == 0  # validation refused it before its grammar was compiled
        await collect(engine, guided_request("x", [1, 2], GuidedDecoding(json_schema=SCHEMA), temperature=0.0))
        await collect(engine, guided_request("y", [3, 2], GuidedDecoding(json_schema=json.loads(json.dumps(SCHEMA))),
                                             temperature=0.0))
        assert (engine._guides().misses, engine._guides().hits) == (1, 1)  # cached by schema


async def test_guided_request_to_an_engine_not_started_is_not_ready(model) -> None:
    path, _ = model
    engine = NativeEngine(EngineConfig(model=str(path), device="cpu"))  # never started: no tokenizer loaded yet
    with pytest.raises(EngineNotReadyError, match="not started"):
        await collect(engine, guided_request("n", [1, 2], GuidedDecoding(json_object=True)))
