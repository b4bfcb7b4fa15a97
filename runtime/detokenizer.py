"""IncrementalDetokenizer: turns a growing list of output ids into text deltas.

Invariant: the concatenation of every `push()` plus the final `flush()` equals
`tokenizer.decode(output_ids, skip_special_tokens)`. Leading spaces and multi-byte characters split across
tokens come out exactly as in that one-shot decode.

Method (the one vLLM uses, written anew): keep two offsets into the ids. `read` ends the text already
emitted; `prefix` starts a short context window before it. Each push decodes `ids[prefix:read]` and
`ids[prefix:]` and emits the difference. The context matters for tokenizers whose decoders treat the first
token of a string specially (SentencePiece strips its leading space); it holds at least the last emitted
token, so a push costs O(window), not O(sequence length). The window moves on only once it spans WINDOW
tokens: until then the last push's decode of `ids[prefix:]` is the next push's `ids[prefix:read]`, so
most pushes decode once, not twice. Text ending in U+FFFD (an incomplete UTF-8
character) is held back until a later token completes it, or until `flush()`; so is a trailing run of
SentencePiece byte pieces, whose text transformers decides only when the run ends (Tokenizer docs).
Text of the same push before the held part goes out at once.

Byte-level tokenizers (`Tokenizer.byte_pieces`) take a shorter road: a token's text is its bytes, so the
stream is those bytes through an incremental UTF-8 decoder, which holds an incomplete character back by
itself; no tokenizer call per token.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from runtime.tokenizer import Tokenizer

_REPLACEMENT_CHAR = "\ufffd"
WINDOW = 8  # tokens of decode window before it moves on


class IncrementalDetokenizer:
    """Text for one output sequence, emitted as token ids arrive."""

    def __init__(
        self, tokenizer: Tokenizer, prompt_token_ids: Sequence[int], skip_special_tokens: bool = True
    ) -> None:
        # prompt_token_ids is part of the shared contract but deliberately unused: output text is
        # decode(output_ids) alone (as TensorRT-LLM and transformers' streamers define it), so it never
        # depends on how the prompt ended.
        del prompt_token_ids
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        # Skipped special tokens are dropped before windowing: left in, one could start a window and
        # make the decoder treat the next real token as the first of the string.
        self._dropped = tokenizer.special_token_ids if skip_special_tokens else frozenset()
        self._ids: list[int] = []
        self._prefix = 0  # start of the decode window (context already emitted)
        self._read = 0  # ids before this are emitted as text
        self._sent = 0  # chars of ids[read:]'s text emitted ahead (the settled part of a held push)
        self._prefix_text: str | None = None  # decode(ids[prefix:read]) when already known
        self._pieces = tokenizer.byte_pieces
        # "replace": an invalid byte shows as U+FFFD, as in the tokenizer's own (lossy) decode
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token_ids: Sequence[int]) -> str:
        """Append new output ids; return the text they complete (may be "" while a char is split)."""
        pieces, dropped = self._pieces, self._dropped
        if pieces is not None:
            if len(token_ids) == 1:  # a streamed step's one token: no generator and join
                token_id = token_ids[0]
                return self._utf8.decode(b"" if token_id in dropped else pieces.get(token_id, b""))
            return self._utf8.decode(b"".join(pieces.get(t, b"") for t in token_ids if t not in dropped))
        self._ids.extend(t for t in token_ids if t not in dropped)
        return self._emit(final=False)

    def flush(self) -> str:
        """Text still held back at the end of the sequence (an incomplete character shows as U+FFFD)."""
        if self._pieces is not None:
            return self._utf8.decode(b"", final=True)
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        ids, read = self._ids, self._read
        if read == len(ids):
            return ""
        decode = self._tokenizer.decode
        prefix_text = self._prefix_text
        if prefix_text is None:
            prefix_text = decode(ids[self._prefix : read], self._skip_special)
        end = len(ids)
        if not final:  # an open run of byte pieces is not final text yet
            while end > read and ids[end - 1] in self._tokenizer.byte_fallback_ids:
                end -= 1
        full = decode(ids[self._prefix : end], self._skip_special) if end > read else prefix_text
        text = full[len(prefix_text) :]
        if final or (end == len(ids) and not text.endswith(_REPLACEMENT_CHAR)):
            # every new token's text is settled: it becomes context; past WINDOW tokens the window moves on
            out = text[self._sent :]
            if len(ids) - self._prefix > WINDOW:
                self._prefix, self._prefix_text = read, None
            else:
                self._prefix_text = full
            self._read, self._sent = len(ids), 0
            return out
        # Text before a trailing incomplete character (or open byte run) is settled already: emit it
        # now and remember how much of the unsettled tokens' text went out.
        stable = text.rstrip(_REPLACEMENT_CHAR)
        out = stable[self._sent :]
        self._sent = max(self._sent, len(stable))
        return out
