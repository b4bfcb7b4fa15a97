"""Reasoning in `<think>...</think>` tags (Qwen3, DeepSeek-R1 style), split from the answer as it streams.

An output that opens with `<think>` (after whitespace) reasons until `</think>`; what follows is the answer,
its leading whitespace dropped (Qwen3 writes `</think>\\n\\n`). An output that does not open with the tag is all
answer (Qwen3 with `enable_thinking: false`: its template closes an empty block in the prompt). Cut off
before `</think>`, everything is reasoning. As vLLM's reasoning parsers, the reasoning goes to the message's
`reasoning_content` (`delta.reasoning_content` in streams).
"""

from __future__ import annotations

from typing import Literal

THINK_BEGIN, THINK_END = "<think>", "</think>"


def held_back(text: str, marker: str) -> int:
    """How many characters at the end of `text` could be the start of `marker` (kept until more arrives)."""
    return next((k for k in range(min(len(marker) - 1, len(text)), 0, -1) if marker.startswith(text[-k:])), 0)


class ThinkStream:
    """Splits one choice's streamed text into (reasoning, answer) pieces."""

    def __init__(self) -> None:
        self._mode: Literal["start", "reasoning", "after", "answer"] = "start"
        self._buf = ""

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """(reasoning, answer) to send now; `final` flushes what was held back."""
        self._buf += text
        reasoning = ""
        if self._mode == "start":
            opening = self._buf.lstrip()
            if opening.startswith(THINK_BEGIN):
                self._mode, self._buf = "reasoning", opening[len(THINK_BEGIN):]
            elif THINK_BEGIN.startswith(opening) and not final:
                return "", ""
            else:
                self._mode = "answer"
        if self._mode == "reasoning":
            end = self._buf.find(THINK_END)
            if end < 0:
                keep = 0 if final else held_back(self._buf, THINK_END)
                reasoning, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep:]
                return reasoning, ""
            reasoning, self._buf, self._mode = self._buf[:end], self._buf[end + len(THINK_END):], "after"
        if self._mode == "after":  # the whitespace between the block and the answer
            self._buf = self._buf.lstrip()
            if not self._buf:
                return reasoning, ""
            self._mode = "answer"
        answer, self._buf = self._buf, ""
        return reasoning, answer
