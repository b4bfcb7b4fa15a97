"""StopStringMatcher: finds stop strings in streamed text, whatever the token/text boundaries.

Semantics:
- Text that could still be the start of a stop string is held back until the next push decides.
- Several stop strings: the match that completes first in the text wins (the smallest end offset; on a
  tie, the one starting first). This does not depend on how the text was chunked: the result is the same
  as feeding it one character at a time.
- On a match, the output excludes the stop string (or ends with it when `include_in_output`), and all
  later text is dropped; the matcher is then done and `push` returns ("", None).
- `flush()` at the end of the sequence returns the held-back text (no stop string matched).
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    """Streams text through, cutting it at the first stop string."""

    def __init__(self, stop: Sequence[str], include_in_output: bool = False) -> None:
        self._stops = tuple(dict.fromkeys(s for s in stop if s))  # drop empties and duplicates
        self._include = include_in_output
        self._max_hold = max((len(s) for s in self._stops), default=1) - 1
        self._held = ""
        self.matched: str | None = None

    @property
    def active(self) -> bool:
        """Whether a stop string may still match."""
        return bool(self._stops) and self.matched is None

    def push(self, text: str) -> tuple[str, str | None]:
        """Feed new text; return (text safe to emit now, the stop string that matched or None)."""
        if self.matched is not None:
            return "", None
        if not self._stops:
            return text, None
        buf = self._held + text
        # The held text contained no complete match, so any match ends inside the new text.
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for s in self._stops:
            start = buf.find(s)
            if start >= 0:
                cand = (start + len(s), start, s)
                if best is None or cand[:2] < best[:2]:
                    best = cand
        if best is not None:
            end, start, s = best
            self.matched = s
            self._held = ""
            return buf[: end if self._include else start], s
        hold = self._partial_match_len(buf)
        self._held = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], None

    def flush(self) -> str:
        """Held-back text at the end of the sequence (only text that never completed a match)."""
        held, self._held = self._held, ""
        return held

    def _partial_match_len(self, buf: str) -> int:
        """Length of the longest suffix of `buf` that is a proper prefix of some stop string."""
        for k in range(min(len(buf), self._max_hold), 0, -1):
            tail = buf[-k:]
            if any(s.startswith(tail) for s in self._stops):
                return k
        return 0
