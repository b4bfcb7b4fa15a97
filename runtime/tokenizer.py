"""Tokenizer: a thin wrapper over a local Hugging Face tokenizer folder.

Adds what the runtime needs on top of `transformers.AutoTokenizer`: the full set of end-of-sequence ids
(the tokenizer's, generation_config.json's and config.json's, any of which may be a list), chat templates
that fail with a typed error, and the exact text/bytes of single tokens for OpenAI logprobs.

Decoding never applies `clean_up_tokenization_spaces`: that rewrite (" ." -> ".") depends on text on
both sides of a token boundary, so streamed text could not equal the decoded whole. vLLM's streamed
output behaves the same way.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Sequence
from typing import Any

from runtime.errors import InvalidRequestError

_BYTE_FALLBACK_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_METASPACE = "\u2581"  # SentencePiece's word-boundary marker, decoded as a space


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte <-> printable-character table used by byte-level BPE vocabularies."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\xa1"), ord("\xac") + 1))
        + list(range(ord("\xae"), ord("\xff") + 1))
    )
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


_BYTE_LEVEL_DECODER = {ch: b for b, ch in bytes_to_unicode().items()}


def _decoder_types(decoder: dict[str, Any] | None) -> set[str]:
    """Types of a tokenizer.json decoder, flattening `Sequence` decoders."""
    if not decoder:
        return set()
    if decoder.get("type") == "Sequence":
        return set().union(*(_decoder_types(d) for d in decoder.get("decoders", [])))
    return {decoder.get("type", "")}


def _read_eos_ids(path: str, filename: str) -> list[int]:
    """eos_token_id from a JSON config (int or list; also a multimodal config's text_config)."""
    file = os.path.join(path, filename)
    if not os.path.isfile(file):
        return []
    with open(file, encoding="utf-8") as f:
        data = json.load(f)
    value = data.get("eos_token_id")
    if value is None and isinstance(data.get("text_config"), dict):
        value = data["text_config"].get("eos_token_id")
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def tokenizer_class(path: str) -> Any:
    """transformers' tokenizer class for folder `path`: the one its tokenizer_config.json names (its Fast variant
    first, as AutoTokenizer picks), imported directly: AutoTokenizer's config machinery imports torch, which the front
    end never loads. AutoTokenizer itself only when the folder names no class transformers has. (The first lookup
    is transformers' lazy import, which two threads must not run at once: runtime/process/data_parallel.py.)"""
    import transformers

    file = os.path.join(path, "tokenizer_config.json")
    name = None
    if os.path.isfile(file):
        with open(file, encoding="utf-8") as f:
            name = json.load(f).get("tokenizer_class")
    if isinstance(name, str) and name:
        for candidate in dict.fromkeys([name if name.endswith("Fast") else f"{name}Fast", name]):
            try:
                return getattr(transformers, candidate)
            except (AttributeError, ImportError):
                continue
    return transformers.AutoTokenizer


class Tokenizer:
    """Text <-> token ids for one model, loaded from a local folder (never from the hub)."""

    def __init__(self, hf: Any, extra_eos_token_ids: Sequence[int] = ()) -> None:
        self.hf = hf
        self.vocab_size: int = len(hf)
        self.bos_token_id: int | None = hf.bos_token_id
        eos: list[int] = [] if hf.eos_token_id is None else [int(hf.eos_token_id)]
        for i in extra_eos_token_ids:
            if i not in eos:
                eos.append(int(i))
        self.eos_token_ids: list[int] = eos
        # Tokens skip_special_tokens drops: the named special tokens plus every added token flagged
        # special (e.g. <|im_end|>), which fast tokenizers also skip but all_special_ids omits.
        added = getattr(hf, "added_tokens_decoder", {}) or {}
        self.special_token_ids: frozenset[int] = frozenset(hf.all_special_ids) | frozenset(
            i for i, tok in added.items() if getattr(tok, "special", False)
        )
        self._added_text: dict[int, str] = {i: str(tok.content) for i, tok in added.items()}
        # Fast tokenizers: decode straight through the Rust tokenizer. transformers' Python wrapper around
        # it is ~85% of decode time, and the engine decodes every token of every request (measured on the H100).
        self._backend: Any = getattr(hf, "backend_tokenizer", None) if getattr(hf, "is_fast", False) else None
        self._decoder = self._backend_decoder_types()
        self._bytes_cache: dict[int, bytes] = {}
        # No token covers more characters than its longest vocabulary entry (byte-level pieces spell one
        # character per byte, so they only overstate it): a text longer than context x this cannot fit.
        self.max_token_chars: int = max(map(len, hf.get_vocab()), default=1)
        # SentencePiece byte pieces ("<0xE6>"). transformers' ByteFallback decoder turns a whole run of
        # them into U+FFFD when any byte in the run is invalid, so a run's text is final only once a
        # non-byte token ends it (the incremental detokenizer waits for that).
        self.byte_fallback_ids: frozenset[int] = frozenset()
        if "ByteFallback" in self._decoder:
            vocab = hf.get_vocab()
            self.byte_fallback_ids = frozenset(i for t, i in vocab.items() if _BYTE_FALLBACK_TOKEN.match(t))

    @classmethod
    def from_pretrained(cls, path: str) -> Tokenizer:
        """Load the tokenizer in folder `path`; eos ids merged with generation_config.json/config.json."""
        hf = tokenizer_class(path).from_pretrained(path, local_files_only=True)
        extra = _read_eos_ids(path, "generation_config.json") + _read_eos_ids(path, "config.json")
        return cls(hf, extra)

    # -- text <-> ids ---------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text` (with the tokenizer's BOS etc. when add_special_tokens)."""
        return self.encode_many([text], add_special_tokens)[0]

    def encode_many(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Token ids of each of `texts`. The Rust backend's batch call releases the GIL while it works
        (its single-text call holds it: an 8 MB prompt froze every thread for 13 s), and skips
        transformers' Python wrapper, which costs more than the encoding itself."""
        if self._backend is not None:
            # encode_batch_fast (tokenizers >= 0.21) skips the character offsets we never read: 30% less time
            encode = getattr(self._backend, "encode_batch_fast", self._backend.encode_batch)
            return [e.ids for e in encode(list(texts), add_special_tokens=add_special_tokens)]
        return [list(self.hf.encode(t, add_special_tokens=add_special_tokens)) for t in texts]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; incomplete UTF-8 shows as U+FFFD."""
        if self._backend is not None:
            return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return self.hf.decode(
            list(ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def check_fits(self, text: str, context_window: int) -> None:
        """InvalidRequestError when `text` cannot fit `context_window` tokens, told without tokenizing it
        (megabytes take seconds). The 2x margin covers normalizers that shorten text (NFKC composing
        characters) before tokenizing."""
        most = 2 * context_window * self.max_token_chars
        if len(text) > most:
            raise InvalidRequestError(
                f"This model's maximum context length is {context_window} tokens. However, your prompt has "
                f"{len(text)} characters, more than that many tokens can hold (at most {most} characters). "
                "Please reduce the prompt.",
                param="prompt",
            )

    def bad_words_ids(self, words: Sequence[str]) -> list[list[int]]:
        """Token sequences to ban for each bad word: as written and with a leading space (as vLLM)."""
        variants = [v for word in words for v in (word, " " + word.lstrip())]
        unique = dict.fromkeys(tuple(ids) for ids in self.encode_many(variants, add_special_tokens=False) if ids)
        return [list(ids) for ids in unique]

    def apply_chat_template(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """Render `messages` (and `tools`) with the model's chat template into prompt text."""
        if not getattr(self.hf, "chat_template", None):
            raise InvalidRequestError(
                "This model has no chat template, so chat requests are not supported; "
                "use /v1/completions with a plain prompt instead.",
                param="messages",
            )
        try:
            text = self.hf.apply_chat_template(
                messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **template_kwargs,
            )
        except Exception as exc:
            # Templates reject bad conversations themselves (jinja2 errors: "roles must alternate");
            # transformers raises ValueError for unusable messages. Both are the client's fault.
            if type(exc).__module__.startswith("jinja2") or isinstance(exc, ValueError):
                raise InvalidRequestError(f"Chat template error: {exc}", param="messages") from exc
            raise
        return str(text)

    # -- single tokens, for logprobs -------------------------------------------------------------

    def token_bytes(self, token_id: int) -> list[int]:
        """The UTF-8 bytes one token contributes to decoded text (may be a partial character)."""
        return list(self._token_raw_bytes(token_id))

    def token_text(self, token_id: int) -> str:
        """The text of one token; bytes of a partial UTF-8 character show as U+FFFD (as OpenAI)."""
        return self._token_raw_bytes(token_id).decode("utf-8", errors="replace")

    def _token_raw_bytes(self, token_id: int) -> bytes:
        cached = self._bytes_cache.get(token_id)
        if cached is None:
            cached = self._compute_token_bytes(token_id)
            self._bytes_cache[token_id] = cached
        return cached

    def _compute_token_bytes(self, token_id: int) -> bytes:
        if token_id in self._added_text:  # added tokens are stored verbatim, never byte-mapped
            return self._added_text[token_id].encode("utf-8")
        piece = self.hf.convert_ids_to_tokens(token_id)
        if piece is None:
            return b""
        if "ByteLevel" in self._decoder and all(ch in _BYTE_LEVEL_DECODER for ch in piece):
            return bytes(_BYTE_LEVEL_DECODER[ch] for ch in piece)
        if "ByteFallback" in self._decoder:
            m = _BYTE_FALLBACK_TOKEN.match(piece)
            if m:
                return bytes([int(m.group(1), 16)])
        if "Metaspace" in self._decoder or "ByteFallback" in self._decoder or "Replace" in self._decoder:
            # SentencePiece pieces: the marker is a space (kept here, unlike decode([id]) which strips
            # a leading one), so a token's text shows the space it adds to the output.
            return piece.replace(_METASPACE, " ").encode("utf-8")
        return self.decode([token_id], skip_special_tokens=False).encode("utf-8")

    @functools.cached_property
    def byte_pieces(self) -> dict[int, bytes] | None:
        """Each token's bytes, when decoding is their concatenation read as UTF-8 (byte-level BPE: GPT-2,
        Llama 3, SmolLM2, Qwen); else None. The incremental detokenizer then streams text from this table
        instead of calling the tokenizer (one Rust decode per token was a third of a batch-256 step's host
        time on the H100). Checked against the tokenizer's own decode of every single token; built on first
        use (the engine and the front end build it at load time)."""
        if self._decoder != {"ByteLevel"} or self._backend is None:
            return None
        pieces = {}
        for piece, i in self.hf.get_vocab().items():
            mapped = all(ch in _BYTE_LEVEL_DECODER for ch in piece)
            pieces[i] = bytes(_BYTE_LEVEL_DECODER[ch] for ch in piece) if mapped else piece.encode("utf-8")
        ids = sorted(pieces)
        decoded = self._backend.decode_batch([[i] for i in ids], skip_special_tokens=False)
        if any(pieces[i].decode("utf-8", errors="replace") != text for i, text in zip(ids, decoded)):
            return None
        return pieces

    def _backend_decoder_types(self) -> set[str]:
        backend = getattr(self.hf, "backend_tokenizer", None)
        if backend is None:  # a slow (Python) tokenizer: fall back to decode([id])
            return set()
        return _decoder_types(json.loads(backend.to_str()).get("decoder"))
