"""OpenAI tools: schemas, the decoding constraint for tool_choice, and parsing calls out of the output.

The chat template renders `tools` into the prompt; the model answers with calls in the template's
format, which we detect from the template text:
- Hermes/Qwen: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (possibly several, with
  free text around them);
- Llama 3 JSON: the whole answer is `{"name": ..., "parameters": {...}}` (several joined by ";").
tool_choice "required" or a named function constrains decoding (runtime/guided) to exactly one call
whose arguments match the function's `parameters` schema; "auto" parses whatever the model wrote
(only the first call when parallel_tool_calls is false); "none" renders no tools at all.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from adapters.openai.response_format import ResponseFormat, response_format_guided
from runtime.errors import InvalidRequestError
from runtime.schema_check import check_schema
from runtime.request import GuidedDecoding

_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolSpec(BaseModel):
    """One entry of `tools` (only function tools exist in the chat API)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["function"] = "function"
    function: FunctionSpec


class _FunctionName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    """tool_choice naming one function: {"type": "function", "function": {"name": ...}}."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["function"] = "function"
    function: _FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


@dataclass
class ToolCall:
    """One parsed call; `arguments` is a JSON string, as OpenAI sends it."""

    name: str
    arguments: str
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or f"call_{uuid.uuid4().hex[:24]}"

    def wire(self, index: int | None = None) -> dict[str, Any]:
        """The OpenAI tool_calls entry (with `index` in stream deltas)."""
        out: dict[str, Any] = {"id": self.id, "type": "function",
                               "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


# ---- formats ------------------------------------------------------------------------------------


class ToolCallFormat:
    """How a chat template writes calls: Hermes tags or Llama 3 JSON (see the module docstring)."""

    def __init__(self, name: str, args_key: str, begin: str = "", end: str = "", max_calls: int | None = None) -> None:
        self.name, self.args_key, self.begin, self.end = name, args_key, begin, end
        self.max_calls = max_calls  # None: every call; 1: parallel_tool_calls=false (later calls are dropped)

    def single(self) -> ToolCallFormat:
        """This format, returning at most one call."""
        return ToolCallFormat(self.name, self.args_key, self.begin, self.end, max_calls=1)

    def call_structure(self, fn: FunctionSpec) -> dict[str, Any]:
        """A structural-tag format element matching exactly one call of `fn`."""
        body = {"type": "object", "properties": {"name": {"const": fn.name},
                                                 self.args_key: fn.parameters or _EMPTY_PARAMETERS},
                "required": ["name", self.args_key], "additionalProperties": False}
        elements: list[dict[str, Any]] = [{"type": "json_schema", "json_schema": body}]
        if self.begin:
            elements = [{"type": "const_string", "value": self.begin + "\n"}, *elements,
                        {"type": "const_string", "value": "\n" + self.end}]
        return {"type": "sequence", "elements": elements}

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content outside the calls or None, calls) of a complete output; unparseable calls stay text."""
        if self.begin:
            calls, content, pos = [], [], 0
            pattern = re.compile(re.escape(self.begin) + r"(.*?)(?:" + re.escape(self.end) + r"|$)", re.S)
            for m in pattern.finditer(text):
                call = _call_from_json(m.group(1), self.args_key)
                if call is None:
                    continue
                content.append(text[pos:m.start()])
                calls.append(call)
                pos = m.end()
            content.append(text[pos:])
            rest = "".join(content).strip()
            return (rest or None) if calls else text, calls[: self.max_calls]
        stripped = text.strip()
        if stripped.startswith("{"):
            calls = [_call_from_json(part, self.args_key) for part in stripped.split(";")]
            if calls and all(c is not None for c in calls):
                return None, calls[: self.max_calls]  # type: ignore[return-value]
        return text, []


HERMES = ToolCallFormat("hermes", "arguments", "<tool_call>", "</tool_call>")
LLAMA3_JSON = ToolCallFormat("llama3_json", "parameters")


def tool_call_format(chat_template: Any, parallel: bool = True) -> ToolCallFormat:
    """The format the model's chat template teaches: Hermes tags if it mentions them, else Llama 3 JSON;
    `parallel` False: at most one call is returned."""
    text = json.dumps(chat_template) if not isinstance(chat_template, str) else chat_template
    fmt = HERMES if "<tool_call>" in text else LLAMA3_JSON
    return fmt if parallel else fmt.single()


def _call_from_json(body: str, args_key: str) -> ToolCall | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    return ToolCall(obj["name"], args if isinstance(args, str) else json.dumps(args))


# ---- requests -----------------------------------------------------------------------------------


def check_tools(tools: list[ToolSpec] | None, choice: ToolChoice | None) -> None:
    """400 for a tool_choice that cannot be honoured or a parameters schema the grammar cannot enforce."""
    names = [t.function.name for t in tools or []]
    if choice == "required" and not names:
        raise InvalidRequestError("tool_choice 'required' needs at least one tool", param="tool_choice")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise InvalidRequestError(f"tool_choice names function '{choice.function.name}', which is not "
                                  f"in tools ({', '.join(names) or 'none given'})", param="tool_choice")
    if len(set(names)) != len(names):
        raise InvalidRequestError("tool function names must be unique", param="tools")
    for t in tools or []:
        if t.function.parameters is not None:
            check_schema(t.function.parameters, param="tools")


def calls_tools(tools: list[ToolSpec] | None, choice: ToolChoice | None) -> bool:
    """Whether tools are rendered into the prompt and calls parsed from the output."""
    return bool(tools) and choice != "none"


def tool_guided(tools: list[ToolSpec], choice: ToolChoice | None, fmt: ToolCallFormat) -> GuidedDecoding | None:
    """The constraint for tool_choice: one call of the named function, or of any tool for "required"."""
    if isinstance(choice, NamedToolChoice):
        chosen = [t.function for t in tools if t.function.name == choice.function.name]
    elif choice == "required":
        chosen = [t.function for t in tools]
    else:
        return None
    options = [fmt.call_structure(fn) for fn in chosen]
    structure = options[0] if len(options) == 1 else {"type": "or", "elements": options}
    return GuidedDecoding(structural_tag={"type": "structural_tag", "format": structure}, param="tools")


# ---- output -------------------------------------------------------------------------------------


def with_tool_calls(finish_reason: str | None, made_calls: bool) -> str | None:
    """OpenAI reports "tool_calls" when the model stopped after calling tools."""
    return "tool_calls" if made_calls and finish_reason == "stop" else finish_reason


class ToolCallStream:
    """Splits one choice's streamed text into content and tool_calls deltas.

    Hermes: text that may start a `<tool_call>` tag is held back until it does or cannot; a call is
    sent once its closing tag arrives (or at the end). Llama 3 JSON: an answer starting with "{" is held
    back to the end and parsed whole; any other answer streams as content.
    """

    def __init__(self, fmt: ToolCallFormat) -> None:
        self.fmt = fmt
        self.num_calls = 0
        self._buf = ""
        self._in_call = False
        self._json_answer: bool | None = None  # Llama 3: undecided until the first non-space character

    def push(self, text: str, final: bool = False) -> tuple[str, list[dict[str, Any]]]:
        """(content to send now, tool_calls delta entries); `final` flushes everything held back."""
        self._buf += text
        content, calls = self._split_tags() if self.fmt.begin else self._split_json(final)
        if final and self._buf:
            rest, tail_calls = self.fmt.parse(self.fmt.begin + self._buf if self._in_call else self._buf)
            content += rest or ""
            calls += tail_calls
            self._buf = ""
        if self.fmt.max_calls is not None:
            calls = calls[: max(0, self.fmt.max_calls - self.num_calls)]
        if self.num_calls or calls:  # after a call, bare whitespace is not an answer
            content = content if content.strip() else ""
        entries = [call.wire(self.num_calls + i) for i, call in enumerate(calls)]
        self.num_calls += len(calls)
        return content, entries

    def _split_tags(self) -> tuple[str, list[ToolCall]]:
        begin, end = self.fmt.begin, self.fmt.end
        out: list[str] = []
        calls: list[ToolCall] = []

        def text(piece: str) -> None:  # between and after calls, bare whitespace is not an answer
            if piece.strip() or not (self.num_calls or calls):
                out.append(piece)

        while True:
            if not self._in_call:
                i = self._buf.find(begin)
                if i < 0:
                    keep = next((k for k in range(min(len(begin) - 1, len(self._buf)), 0, -1)
                                 if begin.startswith(self._buf[-k:])), 0)
                    text(self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    break
                text(self._buf[:i])
                self._buf, self._in_call = self._buf[i + len(begin):], True
            else:
                j = self._buf.find(end)
                if j < 0:
                    break
                call = _call_from_json(self._buf[:j], self.fmt.args_key)
                if call is None:
                    out.append(begin + self._buf[: j + len(end)])
                else:
                    calls.append(call)
                self._buf, self._in_call = self._buf[j + len(end):], False
        return "".join(out), calls

    def _split_json(self, final: bool) -> tuple[str, list[ToolCall]]:
        if self._json_answer is None and self._buf.strip():
            self._json_answer = self._buf.lstrip().startswith("{")
        if self._json_answer is False:
            out, self._buf = self._buf, ""
            return out, []
        return "", []


# ---- one chat request -----------------------------------------------------------------------------


def template_tools(tools: list[ToolSpec] | None, choice: ToolChoice | None) -> list[dict[str, Any]] | None:
    """`tools` as the chat template receives them (OpenAI's shape), or None when no tools apply."""
    return [t.model_dump(exclude_none=True) for t in tools or []] if calls_tools(tools, choice) else None


def chat_guided(tools: list[ToolSpec] | None, choice: ToolChoice | None, response_format: ResponseFormat | None,
                chat_template: Any) -> GuidedDecoding | None:
    """The one decoding constraint of a chat request: a forced tool call, or the response format."""
    from_tools = tool_guided(tools or [], choice, tool_call_format(chat_template)) if tools else None
    from_format = response_format_guided(response_format)
    if from_tools is not None and from_format is not None:
        raise InvalidRequestError("response_format cannot be combined with a forced tool_choice "
                                  "('required' or a named function)", param="response_format")
    return from_tools or from_format
