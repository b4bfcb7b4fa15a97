"""GuidedDecoding -> xgrammar Grammar (not yet compiled against a vocabulary).

JSON is generated compactly (no free whitespace), and every run of digits the schema leaves unbounded (an integer
without both bounds, a number's integer part, fraction or exponent, any number of a json_object) is cut short: an
integer part holds at most MAX_DIGITS digits, an int64's, a fraction or exponent one fewer. A model, even a tiny
random one, then cannot stall inside whitespace or a number ("population": 1111... ran to max_tokens on the default
model), and every schema with bounded strings forces termination.
Tool calls come as a structural tag (xgrammar's / TensorRT-LLM's format); the subset we build
(`sequence`, `or`, `const_string`, `json_schema`) is assembled here so that its JSON is compact too.
"""

from __future__ import annotations

import json
import re
from typing import Any

import xgrammar as xgr

from runtime.errors import InvalidRequestError
from runtime.guided_limits import guided_kind
from runtime.request import GuidedDecoding
from runtime.schema_check import check_schema, subschemas


def build_grammar(guided: GuidedDecoding) -> xgr.Grammar:
    """The grammar for `guided`; malformed or unsupported constraints raise InvalidRequestError."""
    kind = guided_kind(guided)
    try:
        if kind == "json_object":
            return _json({"type": "object"}, guided.param)
        if kind == "json_schema":
            return _json(guided.json_schema, guided.param)
        if kind == "regex":
            return xgr.Grammar.from_regex(guided.regex)  # type: ignore[arg-type]
        if kind == "grammar":
            return xgr.Grammar.from_ebnf(guided.grammar)  # type: ignore[arg-type]
        return _structural_tag(guided.structural_tag, guided.param)  # type: ignore[arg-type]
    except InvalidRequestError:
        raise
    except Exception as exc:  # xgrammar raises RuntimeError/ValueError for malformed input
        raise InvalidRequestError(f"invalid {kind} constraint: {_xgrammar_message(exc)}", param=guided.param) from exc


def _xgrammar_message(exc: Exception) -> str:
    """xgrammar's error without its log prefix ("[12:00:00] /project/cpp/file.cc:123: ")."""
    return re.sub(r"^\[[0-9:]+\] \S+:[0-9]+: ", "", str(exc).strip())


MAX_DIGITS = 19  # the most digits of an integer (part) where the schema sets no bound: int64's

_DIGIT_RULE = re.compile(r"^(\w+) ::= \(\(\[0-9\]\)\)$", re.MULTILINE)  # xgrammar's rule for one digit


def _json(schema: Any, param: str) -> xgr.Grammar:
    check_schema(schema, param=param)
    grammar = xgr.Grammar.from_json_schema(json.dumps(_length_as_pattern(schema)), any_whitespace=False,
                                           strict_mode=True)
    return xgr.Grammar.from_ebnf(_bounded_digits(str(grammar)))


def _bounded_digits(ebnf: str) -> str:
    """xgrammar's JSON grammar (its EBNF text) with each unbounded repeat of a digit, `[0-9]*` or a one-digit rule's
    `{n, -1}`, cut to MAX_DIGITS - 1 repeats (integers: after their leading digit)."""
    more = MAX_DIGITS - 1
    ebnf = ebnf.replace("[0-9]*", f"[0-9]{{0, {more}}}")
    for rule in _DIGIT_RULE.findall(ebnf):
        ebnf = re.sub(rf"\b{rule}\{{(\d+), -1\}}", rf"{rule}{{\1, {more}}}", ebnf)
    return ebnf


def _length_as_pattern(schema: Any) -> Any:
    """A copy of `schema` whose length-bounded strings are patterns.

    xgrammar 0.2's rule for minLength/maxLength admits raw control characters, which are not valid
    JSON; a pattern of plain characters (no controls, quotes or backslashes) bounds the length and
    keeps the output parseable.
    """
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for path, sub in subschemas(schema, ""):
        keys = path.strip("/").split("/")
        target = out
        for key in keys[:-1]:  # re-point the copy's containers at fresh copies before replacing
            target[key] = dict(target[key]) if isinstance(target[key], dict) else list(target[key])
            target = target[key]
        target[keys[-1] if isinstance(target, dict) else int(keys[-1])] = _length_as_pattern(sub)
    if ("minLength" in out or "maxLength" in out) and "pattern" not in out:
        low, high = out.pop("minLength", 0), out.pop("maxLength", "")
        out["pattern"] = f'^[^\\x00-\\x1f"\\\\]{{{low},{high}}}$'
    return out


def _structural_tag(tag: dict[str, Any], param: str) -> xgr.Grammar:
    fmt = tag.get("format") if tag.get("type") == "structural_tag" else None
    if not isinstance(fmt, dict):
        raise InvalidRequestError("structural_tag needs {'type': 'structural_tag', 'format': {...}}", param=param)
    grammar = _format(fmt, param)
    return grammar if grammar is not None else xgr.Grammar.from_structural_tag(json.dumps(tag))


def _format(fmt: dict[str, Any], param: str) -> xgr.Grammar | None:
    """Our compact grammar for the formats we know; None: let xgrammar build the whole tag."""
    kind = fmt.get("type")
    if kind == "const_string":
        return xgr.Grammar.from_ebnf(f"root ::= {json.dumps(fmt['value'])}")
    if kind == "json_schema":
        return _json(fmt["json_schema"], param)
    if kind in ("sequence", "or"):
        parts = [_format(element, param) for element in fmt.get("elements", [])]
        if not parts or any(p is None for p in parts):
            return None
        return xgr.Grammar.concat(*parts) if kind == "sequence" else xgr.Grammar.union(*parts)  # type: ignore[arg-type]
    return None
