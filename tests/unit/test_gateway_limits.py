"""gateway.limits.parse_json: what a hostile body gets back (a 400 in the caller's wording), never a 500."""

from __future__ import annotations

import json
import sys

import pytest

from gateway.limits import parse_json
from runtime.errors import InvalidRequestError

SURROGATE = "holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not valid Unicode"


def triton_wording(exc: ValueError) -> str:
    return f"failed to parse the request JSON buffer: {exc}"


@pytest.mark.parametrize(("body", "param"), [
    (rb'{"prompt": "\ud800"}', "prompt"),
    (rb'{"prompt": "ok \uDFFF ok"}', "prompt"),
    (rb'{"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "\udc00"}]}',
     "messages[1].content"),
    (rb'{"bad_words": ["fine", "\ud800"]}', "bad_words[1]"),
    (rb'[[1, "\ud800"]]', "[0][1]"),
    (rb'{"logit_bias": {"\ud800": 1}}', "logit_bias.\\ud800"),  # a key: escaped, so the param is valid text
    (rb'{"logit_bias": {"\ud800": [1]}}', "logit_bias.\\ud800"),
    (b'{"prompt": "\xed\xa0\x80"}', "prompt"),  # raw surrogate bytes: json.loads decodes with surrogatepass
])
def test_a_lone_surrogate_is_a_400_naming_where_it_is(body: bytes, param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_json(body, max_depth=32)
    assert info.value.param == param
    assert info.value.message == (f"We could not parse the JSON body of your request: '{param}' {SURROGATE}. "
                                  "The OpenAI API expects a JSON payload (Content-Type: application/json).")
    info.value.message.encode("utf-8")  # the answer itself must be encodable


def test_a_lone_surrogate_as_the_whole_body_and_in_triton_wording() -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_json(rb'"\ud800"', max_depth=32, parse_error=triton_wording)
    assert info.value.param is None
    assert info.value.message == f"failed to parse the request JSON buffer: the body {SURROGATE}"
    with pytest.raises(InvalidRequestError) as info:
        parse_json(rb'{"text_input": "\ud800"}', max_depth=32, parse_error=triton_wording)
    assert info.value.message == f"failed to parse the request JSON buffer: 'text_input' {SURROGATE}"


def test_valid_unicode_passes_surrogate_pairs_included() -> None:
    assert parse_json(rb'{"prompt": "\ud83d\ude00 caf\u00e9", "n": 1}', max_depth=32) == {"prompt": "😀 café", "n": 1}
    assert parse_json('{"prompt": "日本語 \\\\ud800"}'.encode(), max_depth=32) == {"prompt": "日本語 \\ud800"}
    assert parse_json(b"5", max_depth=0) == 5


@pytest.mark.parametrize(("wording", "prefix"), [
    (None, "We could not parse the JSON body of your request: "),
    (triton_wording, "failed to parse the request JSON buffer: "),
])
def test_an_integer_past_the_conversion_limit_is_a_parse_error(wording, prefix) -> None:
    digits = sys.get_int_max_str_digits()
    body = b'{"max_tokens": ' + b"9" * (digits + 1) + b"}"
    with pytest.raises(InvalidRequestError) as info:
        parse_json(body, 32) if wording is None else parse_json(body, 32, parse_error=wording)
    assert info.value.message.startswith(f"{prefix}a number has more than {digits} digits")
    big = parse_json(b'{"max_tokens": ' + b"9" * digits + b"}", 32)["max_tokens"]  # at the limit: a number
    assert big == 10**digits - 1


def test_depth_is_still_checked_before_unicode() -> None:
    body = json.dumps({"a": [["\ud800"]]}).encode()
    with pytest.raises(InvalidRequestError, match="nested more than 2 levels deep"):
        parse_json(body, max_depth=2)
