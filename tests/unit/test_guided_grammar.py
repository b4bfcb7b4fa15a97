"""runtime/native/guided: schema checks, grammars, the per-sample matcher, bitmasks in the sampler."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from runtime.errors import InvalidRequestError
from runtime.native.guided import GuidedCompiler, GuideState, unsupported_features
from runtime.request import GuidedDecoding, SamplingOptions
from runtime.native.sampler import Sampler, SamplingRow, processed_logits
from tests.tiny_models import build_tiny_model

VOCAB = 300
EOS = 0


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory):
    return AutoTokenizer.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("guided"), "llama"))


@pytest.fixture
def compiler(tok) -> GuidedCompiler:
    return GuidedCompiler(tok, VOCAB, [EOS])


def guide(compiler: GuidedCompiler, **constraint) -> GuideState:
    return compiler.new_guide(compiler.compile(GuidedDecoding(**constraint)))


def ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_unsupported_features_are_listed_with_their_place() -> None:
    schema = {"type": "object", "title": "T", "properties": {
        "a": {"type": "array", "items": {"type": "integer", "multipleOf": 2}, "uniqueItems": True},
        "b": {"anyOf": [{"type": "string", "format": "color"}, {"not": {}}]},
        "c": {"$ref": "https://example.com/x.json"},
    }, "dependentRequired": {"a": ["b"]}}
    assert unsupported_features(schema) == [
        "'dependentRequired' at #", "'uniqueItems' at #/properties/a", "'multipleOf' at #/properties/a/items",
        "'format: color' at #/properties/b/anyOf/0", "'not' at #/properties/b/anyOf/1",
        "non-local '$ref: https://example.com/x.json' at #/properties/c",
    ]
    assert unsupported_features({"type": "object", "description": "x", "$defs": {"P": {"type": "string"}},
                                 "properties": {"p": {"$ref": "#/$defs/P"}}}) == []
    # malformed keyword values are named too (a 400, never a crash in the checker)
    assert unsupported_features({"properties": 5, "anyOf": {"a": 1}}) == [
        "malformed 'properties' (not an object) at #", "malformed 'anyOf' (not an array) at #"]


def test_json_schema_accepts_exactly_valid_compact_json(compiler, tok) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                                               "s": {"type": "string", "maxLength": 3}}, "required": ["n", "s"]}
    g = guide(compiler, json_schema=schema)
    text = '{"n": 7, "s": "ab"}'
    assert g.accept_tokens(ids(tok, text) + [EOS]) == len(ids(tok, text)) + 1
    assert not g.active
    # a control character inside a bounded string is not JSON: rejected (xgrammar's maxLength rule allows it)
    g = guide(compiler, json_schema=schema)
    prefix = ids(tok, '{"n": 7, "s": "')
    assert g.accept_tokens(prefix + ids(tok, "\x03")) == len(prefix) and g.failed
    g = guide(compiler, json_schema=schema)
    assert g.accept_tokens(ids(tok, '{"n": 12')) < len(ids(tok, '{"n": 12'))  # maximum 9


def test_numbers_and_whitespace_the_schema_leaves_unbounded_are_bounded(compiler, tok) -> None:
    """An int64's 19 digits for an integer (part), 18 for a fraction or exponent, any json_object value too: a model
    writing `1111...` must come to an end (the README's parse() of an integer field ran to max_tokens)."""
    schema = {"type": "object", "properties": {"i": {"type": "integer"}, "m": {"type": "integer", "minimum": 1},
                                               "x": {"type": "number"}}, "required": ["i", "m", "x"]}

    def accepted(text: str, **constraint) -> bool:
        return guide(compiler, **constraint).accept_tokens(ids(tok, text) + [EOS]) == len(ids(tok, text)) + 1

    nines, fraction = "9" * 19, "9" * 18
    assert accepted(f'{{"i": -{nines}, "m": {nines}, "x": -{nines}.{fraction}e-{fraction}}}', json_schema=schema)
    more = nines + "9"
    for text in (f'{{"i": {more}, "m": 1, "x": 1}}', f'{{"i": 1, "m": {more}, "x": 1}}',
                 f'{{"i": 1, "m": 1, "x": {more}}}', f'{{"i": 1, "m": 1, "x": 1.{nines}}}',
                 f'{{"i": 1, "m": 1, "x": 1e{nines}}}'):
        assert not accepted(text, json_schema=schema), text
    assert accepted(f'{{"a": [{nines}]}}', json_object=True) and not accepted(f'{{"a": [{more}]}}', json_object=True)
    # nor inside whitespace: the separators are exactly ", " and ": "
    assert not accepted('{"a":  [1]}', json_object=True) and not accepted('{"a": [1] }', json_object=True)
    assert not accepted('{"i": 1,\n "m": 1, "x": 1}', json_schema=schema)


def test_json_object_and_structural_tag(compiler, tok) -> None:
    g = guide(compiler, json_object=True)
    assert g.accept_tokens(ids(tok, '{"a": [1, {"b": null}]}') + [EOS]) == len(ids(tok, '{"a": [1, {"b": null}]}')) + 1
    assert guide(compiler, json_object=True).accept_tokens(ids(tok, "[1]")) == 0  # an object, not any JSON
    call = {"type": "object", "properties": {"name": {"const": "f"}, "arguments": {"type": "boolean"}},
            "required": ["name", "arguments"]}
    tag = {"type": "structural_tag", "format": {"type": "sequence", "elements": [
        {"type": "const_string", "value": "<tool_call>\n"}, {"type": "json_schema", "json_schema": call},
        {"type": "const_string", "value": "\n</tool_call>"}]}}
    text = '<tool_call>\n{"name": "f", "arguments": true}\n</tool_call>'
    g = guide(compiler, structural_tag=tag)
    assert g.accept_tokens(ids(tok, text) + [EOS]) == len(ids(tok, text)) + 1
    bad = '<tool_call>\n{"name": "g"'
    assert guide(compiler, structural_tag=tag).accept_tokens(ids(tok, bad)) < len(ids(tok, bad))


def test_malformed_constraints_are_invalid_requests(compiler) -> None:
    with pytest.raises(InvalidRequestError, match="invalid regex constraint"):
        compiler.compile(GuidedDecoding(regex="(a"))
    with pytest.raises(InvalidRequestError, match="exactly one constraint"):
        compiler.compile(GuidedDecoding(regex="a", json_object=True))
    with pytest.raises(InvalidRequestError, match="'not' at #"):
        compiler.compile(GuidedDecoding(json_schema={"not": {"type": "string"}}))


def test_compiled_grammars_are_cached_by_constraint(compiler) -> None:
    first = compiler.compile(GuidedDecoding(json_schema={"type": "object", "properties": {"a": {"type": "integer"}}}))
    same = json.loads('{"properties": {"a": {"type": "integer"}}, "type": "object"}')  # other key order, other object
    again = compiler.compile(GuidedDecoding(json_schema=same, param="response_format"))  # another field, same grammar
    assert again is first and (compiler.misses, compiler.hits) == (1, 1)


def test_bitmask_masks_only_guided_rows(compiler, tok) -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, VOCAB)
    opts = SamplingOptions(temperature=0.0)
    free = SamplingRow(opts, [1], [], None, [EOS])
    digits = guide(compiler, regex="[0-9]+")
    rows = [free, SamplingRow(opts, [1], [], None, [EOS], guide=digits), free,
            SamplingRow(SamplingOptions(temperature=0.7), [1], [], None, [EOS], guide=guide(compiler, regex="x"))]
    x = processed_logits(logits, rows)
    assert torch.equal(x[0], logits[0]) and torch.equal(x[2], logits[2])  # bit for bit
    allowed = {t for t in range(VOCAB) if not torch.isneginf(x[1, t])}
    assert allowed == {t for t in range(VOCAB) if tok.decode([t]).isdigit() and tok.decode([t]).isascii()}
    assert {t for t in range(VOCAB) if not torch.isneginf(x[3, t])} == {ids(tok, "x")[0]}
    out = Sampler(seed=1)(logits, rows)
    assert out.token_ids[3].item() == ids(tok, "x")[0] and tok.decode([out.token_ids[1].item()]).isdigit()
    assert torch.equal(out.token_ids[[0, 2]], logits[[0, 2]].argmax(-1))


def test_min_tokens_cannot_push_a_guided_row_off_its_grammar(compiler, tok) -> None:
    g = guide(compiler, regex="7")
    g.accept_tokens(ids(tok, "7"))  # complete: only eos may follow, but min_tokens bans eos
    row = SamplingRow(SamplingOptions(temperature=0.0, min_tokens=5), [1], [], None, [EOS], guide=g)
    x = processed_logits(torch.randn(1, VOCAB), [row])
    assert [t for t in range(VOCAB) if not torch.isneginf(x[0, t])] == [EOS]  # the grammar wins
