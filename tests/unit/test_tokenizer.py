"""runtime.tokenizer.Tokenizer against transformers, on tiny tokenizers built here.

Builders (also used by test_detokenizer.py):
- `build_multibyte_bpe`: byte-level BPE (GPT-2/Llama-3/Qwen style) whose merges cut through multi-byte
  characters, with ChatML specials and a chat template;
- `build_sentencepiece_bpe`: Llama-2 style pieces ("\u2581word", byte fallback "<0xC3>", a decoder that
  strips the first leading space).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.errors import InvalidRequestError
from runtime.tokenizer import Tokenizer
from tests.tiny_models import build_tiny_tokenizer, train_byte_level_bpe

MULTIBYTE_CORPUS = [
    "héllo wörld 日本語 🙂 the quick brown fox jumps over the lazy dog.",
    "Ça va? naïve café, ü ß € 😀👍🏽 日本語の文章 hello world",
] * 30
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if tools %}<|im_start|>tools\n{{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_multibyte_bpe(folder: Path, chat_template: str | None = CHAT_TEMPLATE) -> Path:
    """A ~300-token byte-level BPE trained on text with multi-byte characters, saved to `folder`."""
    hf = train_byte_level_bpe(MULTIBYTE_CORPUS, vocab_size=300, eos_token="<|endoftext|>")
    hf.add_tokens(["<tool>"])  # an added token that is not special: never skipped
    if chat_template is not None:
        hf.chat_template = chat_template
    hf.save_pretrained(folder)
    return folder


def build_sentencepiece_bpe(folder: Path) -> Path:
    """A Llama-2 style tokenizer: metaspace pieces, <0xXX> byte fallback, first leading space stripped."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = RustTokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=150, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tok.train_from_iterator(MULTIBYTE_CORPUS, trainer=trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):  # byte fallback pieces, as SentencePiece models ship them
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    spec["decoder"] = {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ],
    }
    hf = PreTrainedTokenizerFast(
        tokenizer_object=RustTokenizer.from_str(json.dumps(spec)),
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
    )
    hf.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def multibyte(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return Tokenizer.from_pretrained(str(build_multibyte_bpe(tmp_path_factory.mktemp("mb"))))


@pytest.fixture(scope="module")
def sentencepiece(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return Tokenizer.from_pretrained(str(build_sentencepiece_bpe(tmp_path_factory.mktemp("sp"))))


def test_encode_decode_match_transformers(multibyte: Tokenizer) -> None:
    text = "héllo wörld 日本語 🙂 ü"
    ids = multibyte.encode(text)
    assert ids == multibyte.hf.encode(text)
    assert multibyte.decode(ids) == text
    assert multibyte.vocab_size == len(multibyte.hf) == 301  # 300 trained + the added "<tool>"


def test_special_tokens_skipped_only_when_asked(multibyte: Tokenizer) -> None:
    start, end, eot = (multibyte.hf.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"))
    tool = multibyte.hf.convert_tokens_to_ids("<tool>")
    assert multibyte.special_token_ids == {start, end, eot}  # "<tool>" is added but not special
    ids = [start] + multibyte.encode("hi") + [tool, end, eot]
    assert multibyte.decode(ids) == "hi<tool>"
    assert multibyte.decode(ids, skip_special_tokens=False) == "<|im_start|>hi<tool><|im_end|><|endoftext|>"


def test_eos_ids_merged_from_generation_config_and_config(tmp_path: Path) -> None:
    folder = tmp_path / "tok"
    hf = build_tiny_tokenizer(folder)
    eot, im_end = hf.convert_tokens_to_ids("<|endoftext|>"), hf.convert_tokens_to_ids("<|im_end|>")
    assert Tokenizer.from_pretrained(str(folder)).eos_token_ids == [eot]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [eot, im_end]}))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "eos_token_id": 7}))
    tok = Tokenizer.from_pretrained(str(folder))
    assert tok.eos_token_ids == [eot, im_end, 7]
    assert tok.bos_token_id == hf.bos_token_id == eot


def test_eos_from_multimodal_text_config(tmp_path: Path) -> None:
    folder = build_multibyte_bpe(tmp_path / "tok")
    (folder / "config.json").write_text(json.dumps({"text_config": {"eos_token_id": [2, 9]}}))
    assert Tokenizer.from_pretrained(str(folder)).eos_token_ids == [0, 2, 9]


def test_missing_folder_never_reaches_the_hub(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        Tokenizer.from_pretrained(str(tmp_path / "does-not-exist"))


def test_chat_template_renders_messages_and_tools(multibyte: Tokenizer) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "héllo"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert multibyte.apply_chat_template(messages) == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhéllo<|im_end|>\n<|im_start|>assistant\n"
    )
    with_tools = multibyte.apply_chat_template(messages, tools=tools, add_generation_prompt=False)
    assert with_tools.endswith('<|im_start|>tools\n[{"type": "function", "function": {"name": "f", "parameters": {}}}]<|im_end|>\n')
    assert "assistant" not in with_tools


def test_chat_template_missing_is_invalid_request(tmp_path: Path) -> None:
    tok = Tokenizer.from_pretrained(str(build_multibyte_bpe(tmp_path / "tok", chat_template=None)))
    with pytest.raises(InvalidRequestError) as err:
        tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert err.value.param == "messages"
    assert "no chat template" in err.value.message


def test_chat_template_raise_exception_is_invalid_request(tmp_path: Path) -> None:
    template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}x"
    tok = Tokenizer.from_pretrained(str(build_multibyte_bpe(tmp_path / "tok", chat_template=template)))
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "x"
    with pytest.raises(InvalidRequestError, match="first must be user"):
        tok.apply_chat_template([{"role": "assistant", "content": "hi"}])


def test_token_bytes_reassemble_text_byte_level(multibyte: Tokenizer) -> None:
    text = "héllo wörld 日本語 🙂 😀👍🏽 x"
    ids = multibyte.encode(text)
    pieces = [multibyte.token_bytes(i) for i in ids]
    assert b"".join(bytes(p) for p in pieces) == text.encode("utf-8")
    # at least one token is a partial character: its text is U+FFFD, its bytes are exact
    partial = [i for i, p in zip(ids, pieces) if multibyte.token_text(i) != bytes(p).decode("utf-8", "ignore")]
    assert partial
    for i in partial:
        assert "\ufffd" in multibyte.token_text(i)
        assert multibyte.token_text(i) == multibyte.hf.decode([i])  # what transformers shows too


def test_token_text_keeps_leading_space_and_added_tokens(multibyte: Tokenizer) -> None:
    (space_world,) = [i for i in multibyte.encode("a world") if multibyte.token_text(i).startswith(" ")][:1]
    assert multibyte.token_text(space_world) == multibyte.hf.decode([space_world])
    eot = multibyte.hf.convert_tokens_to_ids("<|endoftext|>")
    assert multibyte.token_text(eot) == "<|endoftext|>"
    assert multibyte.token_bytes(eot) == list(b"<|endoftext|>")


def test_token_bytes_sentencepiece_byte_fallback(sentencepiece: Tokenizer) -> None:
    text = "hello wörld ø Жx 🙂"  # ø and Ж are not in the training text
    ids = sentencepiece.encode(text)
    pieces = sentencepiece.hf.convert_ids_to_tokens(ids)
    assert any(p.startswith("<0x") for p in pieces)  # some characters only exist as byte pieces
    joined = b"".join(bytes(sentencepiece.token_bytes(i)) for i in ids)
    # pieces carry the leading space of every word (the decoder strips only the first one)
    assert joined == (" " + text).encode("utf-8")
    first_word = ids[0]
    assert sentencepiece.token_text(first_word).startswith(" ")
    assert sentencepiece.token_bytes(sentencepiece.hf.convert_tokens_to_ids("<0xC3>")) == [0xC3]
    assert sentencepiece.token_text(sentencepiece.hf.convert_tokens_to_ids("<0xC3>")) == "\ufffd"


def test_bad_words_ids_with_and_without_leading_space(multibyte: Tokenizer) -> None:
    assert multibyte.bad_words_ids(["world"]) == [
        multibyte.encode("world", add_special_tokens=False),
        multibyte.encode(" world", add_special_tokens=False),
    ]


def test_bad_words_are_banned_as_written_and_after_a_space_once_each(multibyte: Tokenizer) -> None:
    def ids(text: str) -> list[int]:
        return multibyte.hf.encode(text, add_special_tokens=False)

    got = multibyte.bad_words_ids(["hello", " hello", "hello", "wörld"])
    assert got == [ids("hello"), ids(" hello"), ids("wörld"), ids(" wörld")]


def test_encode_many_matches_encode_one_by_one(multibyte: Tokenizer) -> None:
    texts = ["héllo wörld", "", "日本語 🙂"]
    assert multibyte.encode_many(texts, add_special_tokens=False) == [
        multibyte.hf.encode(t, add_special_tokens=False) for t in texts]


def test_text_too_long_for_any_tokenization_of_the_context_is_rejected(multibyte: Tokenizer) -> None:
    most = 2 * 16 * multibyte.max_token_chars
    multibyte.check_fits("a" * most, context_window=16)
    with pytest.raises(InvalidRequestError, match="maximum context length is 16 tokens") as info:
        multibyte.check_fits("a" * (most + 1), context_window=16)
    assert info.value.param == "prompt"
