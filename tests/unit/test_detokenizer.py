"""IncrementalDetokenizer: streamed text must equal the one-shot decode, for any chunking."""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from runtime.detokenizer import WINDOW, IncrementalDetokenizer
from runtime.tokenizer import Tokenizer
from tests.tiny_models import build_tiny_tokenizer
from tests.unit.test_tokenizer import build_multibyte_bpe, build_sentencepiece_bpe

TEXTS = [
    "héllo wörld 日本語 🙂",
    "Ça va? naïve café, ü ß € 😀👍🏽 日本語の文章",
    " leading space and  double  spaces\nnew line ",
    "ø Ж ∑ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 mixed ascii",
]


@pytest.fixture(scope="module", params=["byte_level", "sentencepiece", "tiny_models"])
def tokenizer(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "byte_level":
        build_multibyte_bpe(folder)
    elif request.param == "sentencepiece":
        build_sentencepiece_bpe(folder)
    else:
        build_tiny_tokenizer(folder)
    return Tokenizer.from_pretrained(str(folder))


def stream(tok: Tokenizer, ids: Sequence[int], chunks: Sequence[int], skip: bool = True) -> list[str]:
    """Push `ids` in pieces of the given sizes; return every piece of text, the flush last."""
    detok = IncrementalDetokenizer(tok, prompt_token_ids=[1, 2, 3], skip_special_tokens=skip)
    out, pos = [], 0
    for size in chunks:
        out.append(detok.push(ids[pos : pos + size]))
        pos += size
    assert pos >= len(ids)
    out.append(detok.flush())
    return out


def random_chunks(rng: random.Random, n: int) -> list[int]:
    sizes = []
    while sum(sizes) < n:
        sizes.append(rng.choice([1, 1, 1, 2, 3, 5]))
    return sizes


def test_text_streams_equal_full_decode(tokenizer: Tokenizer) -> None:
    rng = random.Random(0)
    specials = sorted(tokenizer.special_token_ids)
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        for _ in range(5):
            mixed = list(ids)
            for _ in range(2):  # special tokens in the middle of words
                mixed.insert(rng.randrange(len(mixed) + 1), rng.choice(specials))
            for skip in (True, False):
                pieces = stream(tokenizer, mixed, random_chunks(rng, len(mixed)), skip)
                assert "".join(pieces) == tokenizer.decode(mixed, skip_special_tokens=skip)
        # one token at a time, no special tokens: the exact text, with nothing left for flush
        pieces = stream(tokenizer, ids, [1] * len(ids))
        assert "".join(pieces) == tokenizer.decode(ids)
        if "ByteLevel" in tokenizer._decoder:  # byte-level BPE round-trips text exactly
            assert "".join(pieces) == text
        assert pieces[-1] == ""


def test_random_ids_equal_full_decode(tokenizer: Tokenizer) -> None:
    """Arbitrary id soup: invalid UTF-8, lone continuation bytes, specials anywhere."""
    rng = random.Random(1)
    for _ in range(150):
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randrange(1, 25))]
        skip = rng.random() < 0.7
        pieces = stream(tokenizer, ids, random_chunks(rng, len(ids)), skip)
        assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=skip)


def test_split_character_is_held_back_until_complete(tmp_path: Path) -> None:
    tok = Tokenizer.from_pretrained(str(build_tiny_tokenizer(tmp_path / "tok") and tmp_path / "tok"))
    # the tiny tokenizer has no merges for non-ASCII text: "日" is three byte tokens
    ids = tok.encode("a日b", add_special_tokens=False)
    assert len(ids) == 5
    detok = IncrementalDetokenizer(tok, [])
    assert [detok.push([i]) for i in ids] == ["a", "", "", "日", "b"]
    assert detok.flush() == ""


def test_incomplete_character_at_the_end_comes_out_on_flush(tmp_path: Path) -> None:
    tok = Tokenizer.from_pretrained(str(build_tiny_tokenizer(tmp_path / "tok") and tmp_path / "tok"))
    ids = tok.encode("x🙂", add_special_tokens=False)[:3]  # "x" and half of the emoji
    detok = IncrementalDetokenizer(tok, [])
    assert detok.push(ids) == "x"
    assert detok.flush() == "\ufffd" == tok.decode(ids)[1:]
    assert detok.flush() == ""


def test_sentencepiece_spaces_between_words_kept(tmp_path: Path) -> None:
    tok = Tokenizer.from_pretrained(str(build_sentencepiece_bpe(tmp_path / "sp")))
    ids = tok.encode("hello world the dog", add_special_tokens=False)
    pieces = stream(tok, ids, [1] * len(ids))
    assert "".join(pieces) == "hello world the dog"
    assert any(p.startswith(" ") for p in pieces)  # a later word keeps its space


def test_sentencepiece_byte_run_is_final_only_when_it_ends(tmp_path: Path) -> None:
    """transformers turns a whole byte-piece run into U+FFFD if any byte of it is invalid."""
    tok = Tokenizer.from_pretrained(str(build_sentencepiece_bpe(tmp_path / "sp")))
    ids = tok.encode("ø hello", add_special_tokens=False)
    pieces = tok.hf.convert_ids_to_tokens(ids)
    assert pieces[:3] == ["\u2581", "<0xC3>", "<0xB8>"]
    detok = IncrementalDetokenizer(tok, [])
    assert [detok.push([i]) for i in ids[:3]] == ["", "", ""]  # "ø" is complete but its run is open
    assert detok.push(ids[3:4]) == tok.decode(ids[:4])
    assert tok.decode(ids[:4]).startswith("ø ")
    bad = ids[:3] + [tok.hf.convert_tokens_to_ids("<0xE6>")] + ids[3:]
    assert "".join(stream(tok, bad, [1] * len(bad))) == tok.decode(bad) == "\ufffd\ufffd\ufffd hello"


def test_push_cost_does_not_grow_with_length(tokenizer: Tokenizer) -> None:
    """Every decode call sees a short window, however long the sequence is."""
    calls: list[int] = []
    real = tokenizer.decode

    def counting(ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        calls.append(len(ids))
        return real(ids, skip_special_tokens)

    ids = tokenizer.encode(" ".join(TEXTS) * 8, add_special_tokens=False)
    assert len(ids) > 400
    detok = IncrementalDetokenizer(tokenizer, [])
    tokenizer.decode = counting  # type: ignore[method-assign]
    try:
        text = "".join(detok.push([i]) for i in ids) + detok.flush()
    finally:
        del tokenizer.decode
    assert text == tokenizer.decode(ids)
    if tokenizer.byte_pieces is not None:  # byte-level: text from the token byte table, no decode at all
        assert calls == []
        return
    # a window holds up to WINDOW context tokens plus a held-back character (at most 4 byte tokens), or for
    # SentencePiece a run of byte pieces
    longest_run, run = 0, 0
    for i in ids:
        run = run + 1 if i in tokenizer.byte_fallback_ids else 0
        longest_run = max(longest_run, run)
    assert max(calls) <= WINDOW + 4 + longest_run
    # and most pushes decode once: the last decode is the next push's context
    assert len(calls) < 1.4 * len(ids)


def test_byte_level_table_only_where_decode_is_its_bytes(tokenizer: Tokenizer) -> None:
    """The byte-table road is taken for byte-level BPE, never for SentencePiece, and survives added tokens
    that are not byte-mapped (a space inside): streams still equal the one-shot decode."""
    assert (tokenizer.byte_pieces is None) == ("ByteLevel" not in tokenizer._decoder)
    if tokenizer.byte_pieces is None:
        return
    hf = copy.deepcopy(tokenizer.hf)  # the fixture's tokenizer stays as it was
    hf.add_tokens([" <tool call>", "naïve café"])
    hf.add_special_tokens({"additional_special_tokens": ["<|sep|>"]})
    tok = Tokenizer(hf, tokenizer.eos_token_ids)
    assert tok.byte_pieces is not None and len(tok.byte_pieces) == len(hf)
    rng = random.Random(3)
    added = [len(hf) - 3, len(hf) - 2, len(hf) - 1]
    for _ in range(20):
        ids = [rng.choice(added) if rng.random() < 0.2 else rng.randrange(len(hf)) for _ in range(30)]
        for skip in (True, False):
            assert "".join(stream(tok, ids, random_chunks(rng, len(ids)), skip)) == tok.decode(ids, skip)
