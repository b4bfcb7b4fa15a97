"""Byte-level BPE tokenizer for the demo model, with ChatML special tokens and the chat template."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

ENDOFTEXT = "<|endoftext|>"  # document separator; serves as bos, eos and pad like GPT-2's
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"  # ends every chat turn, so it is an eos token for generation
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
CHAT_TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")


def chat_template() -> str:
    """The ChatML + tools Jinja template shipped with the demo tokenizer."""
    return CHAT_TEMPLATE_PATH.read_text(encoding="utf-8")


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE (special tokens get ids 0, 1, 2) and wrap it for transformers."""
    bpe = Tokenizer(models.BPE())
    # No prefix space: code starts at column 0 and a leading space would change the first token.
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte is encodable
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=ENDOFTEXT,
        eos_token=ENDOFTEXT,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=2048,
        clean_up_tokenization_spaces=False,  # keep code text byte-exact on decode
    )
    tokenizer.chat_template = chat_template()
    return tokenizer


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, folder: Path) -> None:
    """Write tokenizer.json, tokenizer_config.json (template included) and chat_template.jinja."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(folder))
    # transformers 5 writes a config only it can read (class "TokenizersBackend", the template only in
    # chat_template.jinja); rewrite it in the form every transformers >= 4.45 loads.
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.pop("backend", None)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = config.pop("extra_special_tokens", None)
    config["additional_special_tokens"] = list(extra) if isinstance(extra, list) else [IM_START, IM_END]
    config["chat_template"] = tokenizer.chat_template
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (folder / "chat_template.jinja").write_text(tokenizer.chat_template, encoding="utf-8")
