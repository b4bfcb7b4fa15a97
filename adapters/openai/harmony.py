"""gpt-oss's harmony format: the model's messages split into reasoning, answer and tool calls as they stream.

gpt-oss's chat template (openai/gpt-oss-*'s chat_template.jinja) ends the prompt with `<|start|>assistant`;
the model then writes one or more messages, each a header, `<|message|>`, a body and a terminator:

    <|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>
    <|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>

(the recipient may also stand after the role: `<|start|>assistant to=functions.f<|channel|>commentary json`).
As vLLM serves gpt-oss: the analysis channel is reasoning (`reasoning_content`), a message to
`functions.NAME` is a call of NAME whose body is its JSON arguments, the final channel (and commentary to
nobody, the model's preamble) is the answer. Messages to built-in tools (`browser.*`, `python`) are the
model's own business: not shown. An output with no harmony header at all is answer text as it is.

openai-harmony (OpenAI's parser) works on token ids and downloads its vocabulary at start-up; this reads the
detokenized text instead (the markers are special tokens: the request keeps them, adapters/openai/output_reader.py).
"""

from __future__ import annotations

import re
import uuid
from typing import Any, Literal

from adapters.openai.reasoning import held_back
from adapters.openai.tool_calls import CallEvent, ToolCallFormat

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")
_RECIPIENT = re.compile(r"to=([^\s<]+)")

Route = Literal["reasoning", "content", "call", "hidden"]


def is_harmony(chat_template: Any) -> bool:
    """Whether a chat template writes harmony messages (gpt-oss's)."""
    return CHANNEL in str(chat_template) and MESSAGE in str(chat_template)


class HarmonyCallFormat(ToolCallFormat):
    """Calls as gpt-oss writes them; `call_structure` forces one (tool_choice "required" or named)."""

    def __init__(self, max_calls: int | None = None) -> None:
        super().__init__("harmony", "arguments", "json", max_calls=max_calls)

    def single(self) -> HarmonyCallFormat:
        return HarmonyCallFormat(max_calls=1)

    def call_structure(self, fn: Any) -> dict[str, Any]:
        header = f"{CHANNEL}commentary to=functions.{fn.name} {CONSTRAIN}json{MESSAGE}"
        schema = fn.parameters or {"type": "object", "properties": {}}
        return {"type": "sequence", "elements": [{"type": "const_string", "value": header},
                                                 {"type": "json_schema", "json_schema": schema}]}


HARMONY = HarmonyCallFormat()


class HarmonyStream:
    """Splits one choice's streamed harmony text into (reasoning, answer, call events)."""

    def __init__(self, max_calls: int | None = None) -> None:
        self.max_calls = max_calls  # 1: parallel_tool_calls=false (later calls are dropped)
        self._mode: Literal["first", "header", "body", "between", "plain"] = "first"
        self._buf = ""
        self._route: Route = "content"
        self._call = -1  # the index of the call being read
        self._seen = 0

    @property
    def num_calls(self) -> int:
        """Calls returned so far."""
        return self._seen if self.max_calls is None else min(self._seen, self.max_calls)

    def feed(self, text: str, final: bool = False) -> tuple[str, str, list[CallEvent]]:
        """(reasoning, answer, call events) to send now; `final` flushes what was held back."""
        self._buf += text
        out: dict[Route, list[str]] = {"reasoning": [], "content": [], "call": [], "hidden": []}
        events: list[CallEvent] = []
        while self._step(out, events, final):
            pass
        return "".join(out["reasoning"]), "".join(out["content"]), events

    def _step(self, out: dict[Route, list[str]], events: list[CallEvent], final: bool) -> bool:
        if self._mode == "first":  # the prompt opened the message: a header, or plain text from a model without one
            opening = self._buf.lstrip()
            if opening.startswith(("<|", "to=")):
                self._mode = "header"
            elif not final and any(m.startswith(opening) for m in ("<|", "to=")):
                return False
            else:
                self._mode = "plain"
            return True
        if self._mode == "plain":
            out["content"].append(self._buf)
            self._buf = ""
            return False
        if self._mode == "between":
            rest = self._buf.lstrip()
            if rest.startswith(START):
                self._buf, self._mode = rest[len(START):], "header"
                return True
            if START.startswith(rest) and not final:
                return False
            self._mode = "header"  # a header without <|start|>: read it all the same
            return bool(rest)
        if self._mode == "header":
            at = self._buf.find(MESSAGE)
            if at < 0:
                return False  # an output cut off inside a header says nothing
            self._open(self._buf[:at], events)
            self._buf, self._mode = self._buf[at + len(MESSAGE):], "body"
            return True
        return self._body(out, events, final)

    def _open(self, header: str, events: list[CallEvent]) -> None:
        """A message starts: where its body goes."""
        recipient = _RECIPIENT.search(header)
        channel = _CHANNEL.search(header)
        if recipient and recipient.group(1).startswith("functions."):
            self._route, self._call = "call", self._seen
            self._seen += 1
            name = recipient.group(1).removeprefix("functions.")
            self._emit(events, CallEvent("start", self._call, f"call_{uuid.uuid4().hex[:24]}", name))
        elif recipient:
            self._route = "hidden"
        else:
            self._route = "reasoning" if channel and channel.group(1) == "analysis" else "content"

    def _body(self, out: dict[Route, list[str]], events: list[CallEvent], final: bool) -> bool:
        ends = [(i, m) for m in ENDS if (i := self._buf.find(m)) >= 0]
        if ends:
            at, marker = min(ends)
            piece, self._buf, self._mode = self._buf[:at], self._buf[at + len(marker):], "between"
        else:
            keep = 0 if final else max(held_back(self._buf, m) for m in ENDS)
            piece, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep:]
        if piece and self._route == "call":
            self._emit(events, CallEvent("arguments", self._call, text=piece))
        elif piece:
            out[self._route].append(piece)
        return bool(ends)

    def _emit(self, events: list[CallEvent], event: CallEvent) -> None:
        if self.max_calls is None or event.index < self.max_calls:
            events.append(event)
