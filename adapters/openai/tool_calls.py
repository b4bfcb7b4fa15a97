"""Tool calls in the model's output: the formats chat templates teach, and one incremental reader that both
streams calls (arguments as fragments, as OpenAI streams them) and parses whole outputs, so the two agree.

Formats, detected from the chat template text:
- Hermes/Qwen: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, possibly several, with free
  text around them;
- Mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` after any free text;
- Llama 3 JSON: the whole answer is `{"name": ..., "parameters": {...}}` (several joined by ";");
- SmolLM2: `<tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>`, the list of Mistral's layout between
  tags (SmolLM2-1.7B-Instruct's function-calling format; the format of our own tool prompt for templates that
  ignore tools, adapters/openai/tool_prompt.py). An empty list is no call.

A call's `arguments` is the model's own JSON text (OpenAI's too). A call whose name and arguments key have
been read streams at once: a first entry with its id and name, then the argument text as it arrives. A
call cut off by max_tokens ends as what it has (an incomplete call: finish_reason "length"); call markup
that never names a function is dropped, never returned as content. A complete call that is not a call
(broken JSON between tags) stays text.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


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


class ToolCallFormat:
    """How a chat template writes calls (see the module docstring)."""

    def __init__(self, name: str, args_key: str, layout: Literal["tags", "list", "json"], begin: str = "",
                 end: str = "", max_calls: int | None = None) -> None:
        self.name, self.args_key, self.layout, self.begin, self.end = name, args_key, layout, begin, end
        self.max_calls = max_calls  # None: every call; 1: parallel_tool_calls=false (later calls are dropped)

    def single(self) -> ToolCallFormat:
        """This format, returning at most one call."""
        return ToolCallFormat(self.name, self.args_key, self.layout, self.begin, self.end, max_calls=1)

    def call_structure(self, fn: Any) -> dict[str, Any]:
        """A structural-tag format element matching exactly one call of `fn` (a FunctionSpec)."""
        body = {"type": "object", "properties": {"name": {"const": fn.name},
                                                 self.args_key: fn.parameters or _EMPTY_PARAMETERS},
                "required": ["name", self.args_key], "additionalProperties": False}
        elements: list[dict[str, Any]] = [{"type": "json_schema", "json_schema": body}]
        if self.layout == "tags":
            elements = [{"type": "const_string", "value": self.begin + "\n"}, *elements,
                        {"type": "const_string", "value": "\n" + self.end}]
        elif self.layout == "list":
            elements = [{"type": "const_string", "value": self.begin + "["}, *elements,
                        {"type": "const_string", "value": "]" + self.end}]
        return {"type": "sequence", "elements": elements}

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content outside the calls, or None when there are calls and no other text; calls) of an output."""
        reader = ToolCallStream(self)
        content, events = reader.feed(text, final=True)
        calls: list[ToolCall] = []
        for event in events:
            if event.kind == "start":
                calls.append(ToolCall(event.name, "", event.call_id))
            elif event.kind == "arguments":
                calls[-1].arguments += event.text
        if not calls:
            return content, []
        return content.strip() or None, calls


HERMES = ToolCallFormat("hermes", "arguments", "tags", "<tool_call>", "</tool_call>")
MISTRAL = ToolCallFormat("mistral", "arguments", "list", "[TOOL_CALLS]")
LLAMA3_JSON = ToolCallFormat("llama3_json", "parameters", "json")
SMOLLM2 = ToolCallFormat("smollm2", "arguments", "list", "<tool_call>", "</tool_call>")


def tool_call_format(chat_template: Any, parallel: bool = True) -> ToolCallFormat:
    """The format the model's chat template teaches (Mistral's or Hermes' tags if it mentions them, else
    Llama 3 JSON); `parallel` False: at most one call is returned."""
    text = json.dumps(chat_template) if not isinstance(chat_template, str) else chat_template
    fmt = MISTRAL if "[TOOL_CALLS]" in text else HERMES if "<tool_call>" in text else LLAMA3_JSON
    return fmt if parallel else fmt.single()


# ---- reading JSON as it arrives ------------------------------------------------------------------------------

_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*', re.S)


def _value_end(text: str, start: int) -> int | None:
    """The index just past the JSON value that starts at `start` (after whitespace); None if it is incomplete."""
    i, n = start, len(text)
    while i < n and text[i].isspace():
        i += 1
    if i == n:
        return None
    if text[i] == '"':
        i += 1
        while i < n:
            if text[i] == "\\":
                i += 2
                continue
            if text[i] == '"':
                return i + 1
            i += 1
        return None
    if text[i] not in "{[":  # number, true, false, null: ends at a delimiter
        m = re.compile(r"[^\s,}\]]*").match(text, i)
        assert m is not None
        return m.end() if m.end() < n else None
    depth, in_str = 0, False
    while i < n:
        c = text[i]
        if in_str:
            if c == "\\":
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def _call_from_json(body: str, args_key: str) -> ToolCall | None:
    """A call from a complete JSON object (keys in any order), keeping the arguments' own text when it is there."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    return ToolCall(obj["name"], args if isinstance(args, str) else json.dumps(args))


@dataclass
class CallEvent:
    """What the reader learned about call `index`: it starts (id, name), or more of its arguments' text."""

    kind: Literal["start", "arguments"]
    index: int
    call_id: str = ""
    name: str = ""
    text: str = ""


@dataclass
class _OpenCall:
    """The call being read: its text so far and how much of its arguments went out."""

    body: str = ""
    started: bool = False
    index: int = -1
    args_start: int = 0
    args_sent: int = 0
    whole: bool = False  # arguments given as a JSON string: sent once complete, decoded
    events: list[CallEvent] = field(default_factory=list)


class ToolCallStream:
    """Splits one choice's output, as it streams, into content and calls.

    `push` gives complete calls (for consumers that send a call at once), `push_deltas` OpenAI's stream
    entries (the call's id and name, then argument fragments); `feed` the underlying events.
    """

    def __init__(self, fmt: ToolCallFormat) -> None:
        self.fmt = fmt
        self._seen = 0  # calls read, including any past fmt.max_calls
        self._buf = ""
        self._mode: Literal["text", "call", "after", "content"] = "text"
        self._call: _OpenCall | None = None
        self._pending: dict[int, ToolCall] = {}  # push(): calls started, not yet complete

    @property
    def num_calls(self) -> int:
        """Calls returned so far."""
        return self._seen if self.fmt.max_calls is None else min(self._seen, self.fmt.max_calls)

    # -- the three views --

    def push(self, text: str, final: bool = False) -> tuple[str, list[dict[str, Any]]]:
        """(content to send now, complete tool_calls entries)."""
        content, events = self.feed(text, final)
        for event in events:
            if event.kind == "start":
                self._pending[event.index] = ToolCall(event.name, "", event.call_id)
            else:
                self._pending[event.index].arguments += event.text
        done = [i for i in self._pending if i < self._open_index() or final]
        return content, [self._pending.pop(i).wire(i) for i in sorted(done)]

    def push_deltas(self, text: str, final: bool = False) -> tuple[str, list[dict[str, Any]]]:
        """(content to send now, OpenAI tool_calls delta entries: a call's first names it, the rest add arguments)."""
        content, events = self.feed(text, final)
        entries: list[dict[str, Any]] = []
        for event in events:
            if event.kind == "start":
                entries.append({"index": event.index, "id": event.call_id, "type": "function",
                                "function": {"name": event.name, "arguments": ""}})
            elif entries and entries[-1]["index"] == event.index and "id" not in entries[-1]:  # one push: one fragment
                entries[-1]["function"]["arguments"] += event.text
            else:
                entries.append({"index": event.index, "function": {"arguments": event.text}})
        return content, entries

    def feed(self, text: str, final: bool = False) -> tuple[str, list[CallEvent]]:
        """(content to send now, call events); `final` flushes everything held back."""
        self._buf += text
        out: list[str] = []
        events: list[CallEvent] = []
        while self._step(out, events, final):
            pass
        content = "".join(out)
        if self._seen and not content.strip():  # after a call, bare whitespace is not an answer
            content = ""
        allowed = self.fmt.max_calls
        if allowed is not None:
            events = [e for e in events if e.index < allowed]
        return content, events

    def _open_index(self) -> int:
        return self._call.index if self._call is not None and self._call.started else self._seen

    # -- the reader --

    def _step(self, out: list[str], events: list[CallEvent], final: bool) -> bool:
        """Consume what can be decided now; True when it made progress and should run again."""
        if self._mode == "content":
            out.append(self._buf)
            self._buf = ""
            return False
        if self._mode == "text":
            return self._text(out, final)
        if self._mode == "call":
            return self._read_call(out, events, final)
        return self._after(final)

    def _text(self, out: list[str], final: bool) -> bool:
        fmt = self.fmt
        if fmt.layout == "json":  # the answer is a call if it starts with "{"
            stripped = self._buf.lstrip()
            if not stripped:
                if final:
                    out.append(self._buf)
                    self._buf = ""
                return False
            if stripped.startswith("{"):
                self._mode, self._call, self._buf = "call", _OpenCall(), stripped
                return True
            self._mode = "content"
            return True
        i = self._buf.find(fmt.begin)
        if i < 0:
            keep = 0 if final else next((k for k in range(min(len(fmt.begin) - 1, len(self._buf)), 0, -1)
                                         if fmt.begin.startswith(self._buf[-k:])), 0)
            self._say(out, self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep:]
            return False
        self._say(out, self._buf[:i])
        self._buf = self._buf[i + len(fmt.begin):]
        self._mode, self._call = "call", _OpenCall()
        return True

    def _say(self, out: list[str], piece: str) -> None:
        """Content between and after calls: bare whitespace there is not an answer."""
        if piece.strip() or not self._seen:
            out.append(piece)

    def _read_call(self, out: list[str], events: list[CallEvent], final: bool) -> bool:
        call = self._call
        assert call is not None
        call.body += self._buf
        self._buf = ""
        fmt = self.fmt
        if fmt.layout == "list" and not call.started:  # the list's "[" and separators before a call
            call.body = call.body.lstrip().removeprefix("[").lstrip().removeprefix(",").lstrip()
            if call.body.startswith("]"):  # the list ends (or was empty): no call here
                self._call, self._buf, self._mode = None, call.body, "after"
                return True
        if not call.started and (m := _HEADER.match(call.body)):
            call.started, call.index, call.args_start = True, self._seen, m.end()
            self._seen += 1
            call.events.append(CallEvent("start", call.index, f"call_{uuid.uuid4().hex[:24]}",
                                         json.loads(f'"{m.group(1)}"')))
        if call.started:
            args_end = _value_end(call.body, call.args_start)
            value = call.body[call.args_start:].lstrip()
            call.whole = call.whole or value.startswith('"')
            if not call.whole:
                upto = args_end if args_end is not None else len(call.body)
                if upto > call.args_sent + call.args_start:
                    lead = max(call.args_start, call.args_start + call.args_sent)
                    piece = call.body[lead:upto]
                    if call.args_sent == 0:
                        piece = piece.lstrip()
                    call.args_sent = upto - call.args_start
                    if piece:
                        call.events.append(CallEvent("arguments", call.index, text=piece))
        end = _value_end(call.body, 0)
        if fmt.layout == "tags":  # the closing tag ends a call whatever the JSON before it
            stop = call.body.find(fmt.end, call.args_start)
            if stop >= 0 and (end is None or end > stop):
                end = stop
        if end is None and not final:
            events += call.events
            call.events = []
            return False
        return self._close_call(out, events, end)

    def _close_call(self, out: list[str], events: list[CallEvent], end: int | None) -> bool:
        """The call's object is complete (`end`), or the output ended inside it (None)."""
        call = self._call
        assert call is not None
        whole = call.body[:end] if end is not None else call.body
        if call.started:
            if call.whole:
                parsed = _call_from_json(whole, self.fmt.args_key) if end is not None else None
                if parsed is not None:
                    call.events.append(CallEvent("arguments", call.index, text=parsed.arguments))
        elif end is not None:  # a complete object that did not start name-first: a call only if it parses
            parsed = _call_from_json(whole, self.fmt.args_key)
            if parsed is not None:
                call.index = self._seen
                self._seen += 1
                call.events += [CallEvent("start", call.index, parsed.id, parsed.name),
                                CallEvent("arguments", call.index, text=parsed.arguments)]
            elif self.fmt.layout == "json":
                out.append(whole)  # an answer that happens to start with "{"
            else:  # broken call markup stays text, as the model wrote it
                closing = self.fmt.end if call.body[end:].startswith(self.fmt.end) else ""
                out.append(self.fmt.begin + whole + closing)
                end += len(closing)
        events += call.events
        self._call = None
        self._buf = call.body[end:] if end is not None else ""
        self._mode = "after"
        return end is not None

    def _after(self, final: bool) -> bool:
        """Between calls: the closing tag, the list's separators, or Llama 3's ";"."""
        rest = self._buf.lstrip()
        fmt = self.fmt
        if fmt.layout == "tags":
            if rest.startswith(fmt.end):
                self._buf, self._mode = rest[len(fmt.end):], "text"
                return True
            if fmt.end.startswith(rest):  # the closing tag, still arriving (or cut off at the end: dropped)
                if final:
                    self._buf, self._mode = "", "text"
                return False
            self._mode = "text"
            return bool(rest) or final and bool(self._buf)
        if not rest:
            return False
        if fmt.layout == "json" and rest.startswith(";") or fmt.layout == "list" and rest.startswith(","):
            self._buf, self._mode, self._call = rest[1:], "call", _OpenCall()
            return True
        if fmt.layout == "list" and rest.startswith("]"):
            return self._list_end(rest[1:], final)
        self._buf, self._mode = rest, "content"
        return True

    def _list_end(self, tail: str, final: bool) -> bool:
        """After a list's "]": its closing tag where the format has one (SmolLM2's), then text again."""
        end = self.fmt.end
        closing = tail.lstrip()
        if end and closing.startswith(end):
            tail = closing[len(end):]
        elif end and end.startswith(closing):  # the closing tag, still arriving (or cut off at the end: dropped)
            if not final:
                return False
            tail = ""
        self._buf, self._mode = tail, "text"
        return True
