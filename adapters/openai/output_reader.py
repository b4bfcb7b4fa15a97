"""One choice's output read the way the model's chat template taught it to write: reasoning, answer, tool calls.

- gpt-oss (a harmony template): adapters/openai/harmony.py splits all three;
- a template that knows `</think>` (Qwen3's): reasoning in `<think>` tags first (adapters/openai/reasoning.py),
  then the answer's calls in the template's format;
- others: the answer's calls (adapters/openai/tool_calls.py) when tools are in play, else the text as it is.

The same reader serves streams (`feed` piece by piece) and whole responses (`whole`), so the two agree.
Markers that are special tokens (harmony's, Phi-4-mini's `<|tool_call|>`, Mistral's `[TOOL_CALLS]`) would be
dropped by skip_special_tokens; a request whose output needs them keeps them (`keeps_special_tokens`), as
vLLM's tool parsers turn skip_special_tokens off.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from adapters.openai.harmony import CHANNEL, CONSTRAIN, ENDS, MESSAGE, START, HarmonyStream, is_harmony
from adapters.openai.reasoning import THINK_BEGIN, THINK_END, ThinkStream
from adapters.openai.tool_calls import CallEvent, ToolCall, ToolCallFormat, ToolCallStream, calls_of
from adapters.openai.tool_prompt import tool_format
from runtime.tokenizer import Tokenizer


@dataclass
class Piece:
    """What one step of the output added: reasoning text, answer text, call events."""

    reasoning: str = ""
    content: str = ""
    events: list[CallEvent] = field(default_factory=list)


@dataclass
class Whole:
    """A whole output: reasoning (None: none), answer (None when there are calls and no other text), calls."""

    reasoning: str | None
    content: str | None
    calls: list[ToolCall]


def _template(tokenizer: Tokenizer) -> Any:
    return getattr(tokenizer.hf, "chat_template", None)


def thinks(tokenizer: Tokenizer) -> bool:
    """Whether the chat template writes reasoning in `<think>` tags."""
    return THINK_END in str(_template(tokenizer) or "")


class OutputReader:
    """Splits one choice's streamed output into reasoning, answer and tool call events."""

    def __init__(self, tokenizer: Tokenizer, tools: ToolCallFormat | None) -> None:
        """`tools`: the call format when tools are in play, else None (no calls are read)."""
        harmony = is_harmony(_template(tokenizer))
        self._harmony = HarmonyStream(tools.max_calls if tools else None) if harmony else None
        self._think = ThinkStream() if thinks(tokenizer) and not harmony else None
        self._tools = ToolCallStream(tools) if tools is not None and not harmony else None
        self._calls = tools is not None

    @property
    def num_calls(self) -> int:
        """Calls returned so far."""
        if self._harmony is not None:
            return self._harmony.num_calls if self._calls else 0
        return self._tools.num_calls if self._tools is not None else 0

    def feed(self, text: str, final: bool = False) -> Piece:
        """What `text` adds; `final` flushes everything held back."""
        if self._harmony is not None:
            reasoning, content, events = self._harmony.feed(text, final)
            return Piece(reasoning, content, events if self._calls else [])
        reasoning, content = self._think.feed(text, final) if self._think is not None else ("", text)
        if self._tools is None:
            return Piece(reasoning, content)
        content, events = self._tools.feed(content, final)
        return Piece(reasoning, content, events)

    def whole(self, text: str) -> Whole:
        """A whole output read at once."""
        piece = self.feed(text, final=True)
        calls = calls_of(piece.events)
        content: str | None = piece.content
        if calls:
            content = piece.content.strip() or None
        elif self._harmony is not None or self._think is not None:
            content = piece.content or (None if piece.reasoning else "")
        return Whole(piece.reasoning or None, content, calls)


def output_reader(tokenizer: Tokenizer, tools_in_play: bool, parallel: bool = True) -> OutputReader:
    """A reader for one choice of a request; `parallel` False: at most one call is returned."""
    return OutputReader(tokenizer, tool_format(tokenizer, parallel) if tools_in_play else None)


@functools.lru_cache(maxsize=32)
def keeps_special_tokens(tokenizer: Tokenizer, tools_in_play: bool) -> bool:
    """Whether the request's output must keep special tokens: a marker the reader needs is one."""
    markers: list[str] = []
    if is_harmony(_template(tokenizer)):
        markers += [START, CHANNEL, MESSAGE, CONSTRAIN, *ENDS]
    elif tools_in_play:
        fmt = tool_format(tokenizer)
        markers += [m for m in (fmt.begin, fmt.end) if m]
    if thinks(tokenizer):
        markers += [THINK_BEGIN, THINK_END]
    for marker in markers:
        ids = tokenizer.encode(marker, add_special_tokens=False)
        if len(ids) == 1 and ids[0] in tokenizer.special_token_ids:
            return True
    return False
