"""runtime/guided_limits.py: constraints whose compile would take seconds to minutes or hundreds of MiB are
refused before compiling, and the usual ones are not."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pydantic import BaseModel, Field
from transformers import AutoTokenizer

from runtime.errors import InvalidRequestError
from runtime.native.guided import GuidedCompiler
from runtime.guided_limits import pattern_repeats
from runtime.request import GuidedDecoding
from tests.tiny_models import build_tiny_model


@pytest.fixture(scope="module")
def compiler(tmp_path_factory: pytest.TempPathFactory) -> GuidedCompiler:
    tok = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("limits"), "llama"))
    return GuidedCompiler(tok, 300, [0])


def nested_arrays(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


# Each took seconds to minutes to compile on the demo tokenizer (numbers in limits.py), or held 246 MiB.
HOSTILE = {
    "enum of 100k values": ({"json_schema": {"enum": [f"value-{i:06d}" for i in range(100_000)]}},
                            "longer than 65536 characters"),
    "enum of long strings": ({"json_schema": {"enum": [c * 10_000 for c in "abc"]}},
                             "an enum or const string longer than 256 characters"),
    "const object of long strings": ({"json_schema": {"anyOf": [{"const": {"description": c * 300}} for c in "ab"]}},
                                     "an enum or const string longer than 256 characters"),
    "1000 optional properties": ({"json_schema": {"type": "object",
                                                  "properties": {f"p{i}": {"type": "integer"} for i in range(1000)}}},
                                 "more than 512 optional properties (not in their object's 'required')"),
    "8 objects of 256 optional properties": ({"json_schema": {"type": "object", "properties": {
        f"o{j}": {"type": "object", "properties": {f"p{i}": {"type": "boolean"} for i in range(256)}}
        for j in range(8)}}}, "more than 512 optional properties"),
    "negative minLength to hide a large one": ({"json_schema": {"type": "object", "properties": {
        "a": {"type": "string", "maxLength": -5000}, "b": {"type": "string", "minLength": 3000}}}},
        "summing to more than 1000"),
    "minLength 3000": ({"json_schema": {"type": "string", "minLength": 3000}},
                       "string length bounds and pattern repeat counts summing to more than 1000"),
    "maxLength 8000": ({"json_schema": {"type": "string", "maxLength": 8000}}, "summing to more than 1000"),
    "40 strings of maxLength 100": ({"json_schema": {"type": "object", "properties": {
        f"p{i}": {"type": "string", "maxLength": 100} for i in range(40)}}}, "summing to more than 1000"),
    "many minLengths": ({"json_schema": {"type": "object", "properties": {
        f"p{i}": {"type": "string", "minLength": 600} for i in range(2)}, "required": ["p0", "p1"]}},
                        "summing to more than 1000"),
    "pattern repeated 10000 times": ({"json_schema": {"type": "string", "pattern": "^[a-z]{10000}$"}},
                                     "summing to more than 1000"),
    "nested repeats in a pattern": ({"json_schema": {"type": "string", "pattern": "^([a-z]{0,20}){0,20}$"}},
                                    "patterns repeating repeats more than 100 times"),
    "many patterns of nested repeats": ({"json_schema": {"type": "object", "properties": {
        f"p{i}": {"type": "string", "pattern": "^([a-z]{0,7}){0,7}$"} for i in range(20)}}},
        "patterns repeating repeats more than 100 times"),
    "arrays nested 100 deep": ({"json_schema": nested_arrays(100)}, "nested more than 64 levels deep"),
    "a 100 KB regex": ({"regex": "a" * 100_000}, "longer than 65536 characters"),
    "a tool schema in a structural tag": ({"structural_tag": {"type": "structural_tag", "format": {
        "type": "json_schema", "json_schema": {"enum": ["x" * 1000, "y" * 1000]}}}}, "longer than 256 characters"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_costly_constraints_are_refused_before_compiling(compiler: GuidedCompiler, name: str) -> None:
    constraint, why = HOSTILE[name]
    # this process's CPU time (a compile runs in a compile thread): the wall clock also counts other processes'
    # turns (1.19 s once, beside another xdist worker and other sessions' runs)
    start = time.process_time()
    with pytest.raises(InvalidRequestError) as refused:
        compiler.compile(GuidedDecoding(**constraint, param="response_format"))
    assert time.process_time() - start < 1.0  # refused by looking, not by compiling
    assert refused.value.param == "response_format"
    assert refused.value.message.startswith("The guided decoding constraint is too large to compile: ")
    assert why in refused.value.message


@pytest.mark.parametrize("schema, what", [
    ({"type": "object", "properties": {"a": b"bytes"}}, "bytes"),
    ({"enum": [float("nan")]}, "float nan"),
    ({"type": "object", "properties": {3: {"type": "string"}}}, "a key int 3"),
])
def test_a_constraint_holding_what_json_cannot_is_a_400(compiler: GuidedCompiler, schema: Any, what: str) -> None:
    """What a message to the engine core may carry, which JSON cannot (a 500 there before)."""
    with pytest.raises(InvalidRequestError) as refused:
        compiler.compile(GuidedDecoding(json_schema=schema, param="response_format"))
    assert refused.value.message.startswith("The guided decoding constraint is not JSON: it holds ")
    assert what in refused.value.message and refused.value.param == "response_format"


class Address(BaseModel):
    street: str = Field(description="Street and number. " * 40)  # long descriptions cost nothing to compile
    city: str = Field(max_length=500)
    zip: str = Field(pattern=r"^\d{5}(-\d{4})?$")
    ip: str = Field(pattern=r"^(\d{1,3}\.){3}\d{1,3}$")


USUAL = {
    "a response model": {"json_schema": Address.model_json_schema()},
    "enum of 5000 short values": {"json_schema": {"enum": [f"v{i}" for i in range(5000)]}},
    "512 optional properties": {"json_schema": {"type": "object",
                                                "properties": {f"p{i}": {"type": "boolean"} for i in range(512)}}},
    "ten IPv4 addresses": {"json_schema": {"type": "object", "properties": {
        f"ip{i}": {"type": "string", "pattern": r"^(\d{1,3}\.){3}\d{1,3}$"} for i in range(10)}}},
    "1000 required properties": {"json_schema": {"type": "object",
                                                 "properties": {f"p{i}": {"type": "boolean"} for i in range(1000)},
                                                 "required": [f"p{i}" for i in range(1000)]}},
    "arrays nested 60 deep": {"json_schema": nested_arrays(60)},
    "ten strings of maxLength 100": {"json_schema": {"type": "object", "properties": {
        f"p{i}": {"type": "string", "maxLength": 100} for i in range(10)}}},
    "a regex with large counts": {"regex": "([a-z]{0,100}){0,100}"},  # xgrammar's regex path does not unroll
}


@pytest.mark.parametrize("name", list(USUAL))
def test_usual_constraints_compile(compiler: GuidedCompiler, name: str) -> None:
    compiler.compile(GuidedDecoding(**USUAL[name]))


@pytest.mark.parametrize("pattern, counts", [
    (r"^(\d{1,3}\.){3}\d{1,3}$", (9, 9)),  # IPv4: 3 + 3 + 3, a repeat of a repeat 3 x 3
    ("^[a-z]{2,}[0-9]{0,1000}$", (1002, 0)),
    ("^([a-z]?){50}$", (50, 50)),
    ("^((a{10}){10})$", (20, 100)),  # nesting through a group that is not itself repeated
    ("^(a{2}){3}(b{4}){5}$", (14, 26)),  # each repeat of a repeat counts
    (r"[]{]{5}\{9\}x{2,}?", (7, 0)),  # brackets, escapes and lazy modifiers are not counts
    ("x{99999999999}", (10**9, 0)),  # past int()'s digit limit: counted as huge
])
def test_pattern_repeats(pattern: str, counts: tuple[int, int]) -> None:
    assert pattern_repeats(pattern) == counts
