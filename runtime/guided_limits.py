"""Limits on a guided-decoding constraint, checked before it is built and compiled: by the front end's validation
(without xgrammar, which only the engine core loads: runtime/native/guided/) and again by the core's compiler.

xgrammar's build and compile time and memory grow with the constraint's shape, and neither can be
interrupted once started. Measured with xgrammar 0.2.8, the demo model's tokenizer (4096 tokens), one
thread of the shared 2-core development box, 2026-11-25 (build + compile):
- enum of 10k / 30k / 100k short strings: 0.7 / 5.2 / 39 s, compiled 25 / 74 / 246 MiB;
- enum of long strings: 2 of 10k characters (20 KB) 16 s, 30 of 1000: 1.8 s, 300 of 256 (79 KB): 1.6 s;
- optional properties of one object, 300 / 500 / 1000: 0.13 / 0.4 / 5.3 s (1000 required ones: 0.1 s);
  of 4 / 8 objects of 256: 0.6 / 3.2 s;
- minLength, or a pattern's repeat count, 1000 / 3000 / 10000: 0.4 / 3.7 / 6.3 s; maxLength 1000 / 2000 /
  4096 / 8000: 0.5 / 2.2 / 9.8 / 47 s (as a pattern, runtime/native/guided/grammars.py); 10 / 40 strings of
  maxLength 100: 1.1 / 3.4 s;
- nested repeats in a pattern: `([a-z]{0,10}){0,10}` 1.9 s, `{0,20}` 10 s, `{0,100}` over 5 minutes;
  `([a-z]?){50}` 0.4 s, 20 patterns `([a-z]{0,7}){0,7}` 3.4 s;
- arrays nested 64 / 128 / 256 / 500 deep: 0.02 / 0.15 / 1.1 / 6.4 s.
Within the limits below, the slowest single shapes measured take 0.8-1.2 s (a 64 KiB enum of 256-character
strings, 10 strings of maxLength 100, 512 optional properties) and one schema spending every budget at
once 2.1-2.4 s. Larger vocabularies take longer (each grammar state is checked against every token), and
shapes nobody measured may still be slow: GuidedCompiler also refuses any constraint whose compile took
longer than MAX_COMPILE_SECONDS (runtime/native/guided/compiler.py).
"""

from __future__ import annotations

import math
import re
from typing import Any

from runtime.errors import InvalidRequestError, brief
from runtime.request import GuidedDecoding

MAX_CHARS = 64 * 1024  # the constraint, about as long as its JSON
MAX_DEPTH = 64  # nesting of the constraint's JSON
MAX_LITERAL_CHARS = 256  # one enum or const string
MAX_OPTIONAL_PROPERTIES = 512  # properties not in their object's `required`, summed over the constraint
MAX_REPEATS = 1000  # string length bounds and pattern repeat counts (the upper one if any), summed
MAX_NESTED_REPEATS = 100  # the products of the counts of repeats of repeats in patterns, summed
MAX_COMPILE_SECONDS = 5.0  # a compile that took more CPU refuses its constraint from then on

_COUNT = re.compile(r"\{(\d+)(?:(,)(\d*))?\}")
_HUGE = 10**9  # a count of more digits (int() refuses past 4300 of them)


def guided_kind(guided: GuidedDecoding) -> str:
    """The one constraint set on `guided` (InvalidRequestError when none or several are)."""
    kinds = [name for name, on in (
        ("json_schema", guided.json_schema is not None), ("json_object", guided.json_object),
        ("regex", guided.regex is not None), ("grammar", guided.grammar is not None),
        ("structural_tag", guided.structural_tag is not None),
    ) if on]
    if len(kinds) != 1:
        raise InvalidRequestError(f"guided decoding needs exactly one constraint, got {kinds or 'none'}",
                                  param=guided.param)
    return kinds[0]


def check_limits(guided: GuidedDecoding) -> None:
    """InvalidRequestError (naming `guided.param`) for a constraint past a limit above.

    Walks the constraint once, iteratively, and stops at the first limit passed, so a huge constraint
    costs no more than a small one.
    """
    value = getattr(guided, guided_kind(guided))
    if isinstance(value, str):  # regex, EBNF: xgrammar builds these fast whatever their repeats (measured)
        if len(value) > MAX_CHARS:
            raise _too_large(guided.param, f"longer than {MAX_CHARS} characters")
        return
    _Walk(guided.param).run(value)


class _Walk:
    """One pass over a constraint's JSON: size, depth, enum/const strings, object and string keywords."""

    def __init__(self, param: str) -> None:
        self.param = param
        self.chars = self.optional = self.repeats = self.nested = 0

    def run(self, root: Any) -> None:
        stack: list[tuple[Any, int, bool]] = [(root, 1, False)]  # (value, depth, inside enum/const data)
        while stack:
            node, depth, data = stack.pop()
            if depth > MAX_DEPTH:
                raise _too_large(self.param, f"nested more than {MAX_DEPTH} levels deep")
            if isinstance(node, dict):
                if not data:
                    self._keywords(node)
                for key, sub in node.items():
                    if not isinstance(key, str):
                        raise _not_json(self.param, f"a key {_brief(key)}")
                    self.chars += len(key) + 4
                    stack.append((sub, depth + 1, data or key in ("enum", "const")))
            elif isinstance(node, list):
                self.chars += 2 + len(node)
                stack.extend((sub, depth + 1, data) for sub in node)
            elif isinstance(node, str):
                if data and len(node) > MAX_LITERAL_CHARS:
                    raise _too_large(self.param, f"an enum or const string longer than {MAX_LITERAL_CHARS} characters")
                self.chars += len(node) + 2
            elif node is None or isinstance(node, (bool, int)) or (isinstance(node, float) and math.isfinite(node)):
                self.chars += 8
            else:  # what a message from another process may hold that JSON cannot (bytes, NaN, extensions)
                raise _not_json(self.param, _brief(node))
            if self.chars > MAX_CHARS:
                raise _too_large(self.param, f"longer than {MAX_CHARS} characters")

    def _keywords(self, schema: dict[str, Any]) -> None:
        properties, required = schema.get("properties"), schema.get("required")
        if isinstance(properties, dict):
            names = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
            self.optional += len(properties.keys() - names)
            if self.optional > MAX_OPTIONAL_PROPERTIES:
                raise _too_large(self.param, f"more than {MAX_OPTIONAL_PROPERTIES} optional properties "
                                             "(not in their object's 'required')")
        counts, nested = pattern_repeats(schema["pattern"]) if isinstance(schema.get("pattern"), str) else (0, 0)
        for bound in ("maxLength", "minLength"):  # a length-bounded string is a pattern of that count
            if isinstance(schema.get(bound), int):
                counts += max(schema[bound], 0)
                break
        self.repeats, self.nested = self.repeats + counts, self.nested + nested
        if self.repeats > MAX_REPEATS:
            raise _too_large(self.param,
                             f"string length bounds and pattern repeat counts summing to more than {MAX_REPEATS}")
        if self.nested > MAX_NESTED_REPEATS:
            raise _too_large(self.param, f"patterns repeating repeats more than {MAX_NESTED_REPEATS} times "
                                         "(the counts of nested repeats multiplied, summed over patterns)")


def pattern_repeats(pattern: str) -> tuple[int, int]:
    """(the sum of `pattern`'s repeat counts, the sum of the products of the counts of repeats of repeats).

    xgrammar's build time grows with the counts (quadratically, up to some thousands), and nested repeats
    make the grammar ambiguous, which is what makes its compile explode. `*`, `+` and `?` count 1 (and
    are not summed), `{n}` and `{n,}` count n, `{n,m}` m.
    """
    total = nested = 0
    groups = [0]  # per open group: the largest repeat count inside it (0: no repeat)
    atom: int | None = None  # what a quantifier here repeats: None nothing, else its own largest inner count
    i = 0
    while i < len(pattern):
        c = pattern[i]
        count = None
        if c == "\\":
            atom, i = 0, i + 1
        elif c == "[":  # a character class is one atom: skip to its closing bracket
            i += 2 if pattern.startswith("[^", i) else 1
            i += pattern.startswith("]", i)  # a leading ] is a literal
            while i < len(pattern) and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
            atom = 0
        elif c == "(":
            groups.append(0)
            atom = None
        elif c == ")" and len(groups) > 1:
            atom = groups.pop()
            groups[-1] = max(groups[-1], atom)
        elif c in "*+?":
            count = 1
        elif c == "{" and (m := _COUNT.match(pattern, i)):
            low, comma, high = _int(m.group(1)), m.group(2), m.group(3)
            count = _int(high) if high else max(low, 1) if comma else low
            total += count
            i = m.end() - 1
        elif c == "|":
            atom = None
        else:
            atom = 0
        if count is not None and atom is not None:  # a quantifier right after another is a modifier (`*?`)
            if atom:
                nested += count * atom
            groups[-1] = max(groups[-1], count * atom if atom else count)
            atom = None
        i += 1
    return total, nested


def _int(digits: str) -> int:
    return int(digits) if len(digits) < 10 else _HUGE


def _not_json(param: str, what: str) -> InvalidRequestError:
    return InvalidRequestError(f"The guided decoding constraint is not JSON: it holds {what}.", param=param)


def _brief(value: Any) -> str:
    return f"{type(value).__name__} {brief(repr(value), 40)}"


def _too_large(param: str, what: str) -> InvalidRequestError:
    return InvalidRequestError(f"The guided decoding constraint is too large to compile: {what}.", param=param)
