"""A reader for Triton's config.pbtxt (protobuf text format), without a protobuf dependency.

    msg = parse_pbtxt(text)              # {field: [value, ...]}: every field a list (fields repeat)
    model_parameters(msg)                # {"gpt_model_path": "/engines/llama", ...}

Values: str (quoted strings, adjacent ones joined, C escapes), int, float, bool (true/false/True/False),
Enum (bare identifiers such as TYPE_INT32 or KIND_CPU), Placeholder (an unquoted `${name}` left by
fill_template.py), and nested messages (dicts). Lists `[a, b]` add each element to the field.
`#` starts a comment. Errors raise PbtxtError with the line number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

Message = dict[str, list[Any]]

_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")
_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t\r\n]+|\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<placeholder>\$\{\w+\})
  | (?P<number>[-+]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)[fF]?(?![\w.]))
  | (?P<ident>[-+]?[A-Za-z_][\w.]*)
  | (?P<punct>[{}\[\]<>:,;])
    """,
    re.VERBOSE,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "a": "\a", "b": "\b",
            "f": "\f", "v": "\v", "?": "?"}


class PbtxtError(ValueError):
    """A config.pbtxt that is not valid protobuf text format (message names the line)."""


class Enum(str):
    """A bare identifier value (TYPE_FP32, KIND_GPU, ...)."""


@dataclass(frozen=True)
class Placeholder:
    """An unquoted `${name}` template value that fill_template.py did not fill."""

    name: str


def placeholders_in(value: Any) -> list[str]:
    """Names of `${...}` placeholders in a value (quoted or bare)."""
    if isinstance(value, Placeholder):
        return [value.name]
    if isinstance(value, str):
        return _PLACEHOLDER.findall(value)
    return []


def _unescape(body: str, line: int) -> str:
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt in "xX":
            m = re.match(r"[0-9a-fA-F]{1,2}", body[i + 2:])
            if not m:
                raise PbtxtError(f"line {line}: bad \\x escape")
            out.append(chr(int(m.group(), 16)))
            i += 2 + len(m.group())
        elif nxt.isdigit():
            m = re.match(r"[0-7]{1,3}", body[i + 1:])
            assert m is not None
            out.append(chr(int(m.group(), 8)))
            i += 1 + len(m.group())
        else:
            raise PbtxtError(f"line {line}: unknown escape \\{nxt}")
    # Octal/hex escapes are bytes: re-decode runs of them as UTF-8 where they form valid text.
    text = "".join(out)
    try:
        return text.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return text


def _tokenize(text: str) -> list[tuple[str, str, int]]:
    tokens: list[tuple[str, str, int]] = []
    pos, line = 0, 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise PbtxtError(f"line {line}: unexpected character {text[pos]!r}")
        kind = m.lastgroup or ""
        if kind != "ws":
            tokens.append((kind, m.group(), line))
        line += m.group().count("\n")
        pos = m.end()
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokenize(text)
        self.i = 0

    def peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def next(self, what: str) -> tuple[str, str, int]:
        tok = self.peek()
        if tok is None:
            last = self.tokens[-1][2] if self.tokens else 1
            raise PbtxtError(f"line {last}: unexpected end of file, expected {what}")
        self.i += 1
        return tok

    def expect(self, text: str) -> None:
        kind, value, line = self.next(repr(text))
        if value != text:
            raise PbtxtError(f"line {line}: expected {text!r}, got {value!r}")

    def message(self, close: str | None) -> Message:
        msg: Message = {}
        while True:
            tok = self.peek()
            if tok is None:
                if close is not None:
                    self.next(repr(close))
                return msg
            kind, value, line = tok
            if close is not None and value == close:
                self.i += 1
                return msg
            if kind != "ident":
                raise PbtxtError(f"line {line}: expected a field name, got {value!r}")
            self.i += 1
            self.field(msg, value)
            nxt = self.peek()
            if nxt is not None and nxt[1] in (",", ";"):
                self.i += 1

    def field(self, msg: Message, name: str) -> None:
        values = msg.setdefault(name, [])
        tok = self.next(f"a value for {name!r}")
        if tok[1] == ":":
            tok = self.next(f"a value for {name!r}")
        if tok[1] == "[":
            if self.peek() is not None and self.peek()[1] == "]":  # type: ignore[index]
                self.i += 1
                return
            while True:
                values.append(self.value(self.next(f"a list element of {name!r}"), name))
                sep = self.next("',' or ']'")
                if sep[1] == "]":
                    return
                if sep[1] != ",":
                    raise PbtxtError(f"line {sep[2]}: expected ',' or ']', got {sep[1]!r}")
        values.append(self.value(tok, name))

    def value(self, tok: tuple[str, str, int], name: str) -> Any:
        kind, text, line = tok
        if text in ("{", "<"):
            return self.message("}" if text == "{" else ">")
        if kind == "string":
            parts = [_unescape(text[1:-1], line)]
            while self.peek() is not None and self.peek()[0] == "string":  # type: ignore[index]
                _, more, more_line = self.next("string")
                parts.append(_unescape(more[1:-1], more_line))
            return "".join(parts)
        if kind == "placeholder":
            return Placeholder(text[2:-1])
        if kind == "number":
            body = text.rstrip("fF") if not text.lower().startswith(("0x", "-0x", "+0x")) else text
            if re.fullmatch(r"[-+]?0[xX][0-9a-fA-F]+", body):
                return int(body, 16)
            if re.fullmatch(r"[-+]?\d+", body):
                return int(body)
            return float(body)
        if kind == "ident":
            low = text.lower()
            if text in ("true", "True", "t"):
                return True
            if text in ("false", "False", "f"):
                return False
            if low.lstrip("+-") in ("inf", "infinity", "nan"):
                return float(low)
            return Enum(text)
        raise PbtxtError(f"line {line}: expected a value for {name!r}, got {text!r}")


def parse_pbtxt(text: str) -> Message:
    """Parse protobuf text format into {field: [values]} (nested messages are dicts of the same form)."""
    return _Parser(text).message(None)


def first(msg: Message, name: str, default: Any = None) -> Any:
    """The first value of a field, or `default` when absent."""
    values = msg.get(name)
    return values[0] if values else default


def model_parameters(msg: Message) -> dict[str, str]:
    """A model config's `parameters { key: ... value: { string_value: ... } }` entries as a dict."""
    out: dict[str, str] = {}
    for entry in msg.get("parameters", []):
        if not isinstance(entry, dict):
            raise PbtxtError("'parameters' entries must be messages with key and value")
        key = first(entry, "key")
        value = first(entry, "value", {})
        if not isinstance(key, str) or not isinstance(value, dict):
            raise PbtxtError(f"parameter entry without a key or value: {entry!r}")
        string_value = first(value, "string_value", "")
        if isinstance(string_value, Placeholder):  # unquoted ${x}: keep it recognisable
            string_value = "${" + string_value.name + "}"
        out[key] = str(string_value)
    return out
