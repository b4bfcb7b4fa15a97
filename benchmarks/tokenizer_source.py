"""Which tokenizer the benchmarks use: a given folder, else the embedded demo model's, else a tiny
byte-level BPE tokenizer built once on this machine (so the benchmarks run before the demo exists)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

FALLBACK_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "trtllm-gateway" / "bench-tokenizer"

# A ChatML-like template, enough for the chat endpoint to render a prompt.
_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def default_tokenizer_path() -> str:
    """The demo model's folder when runtime.demo provides it, else the fallback tokenizer's folder."""
    try:
        from runtime.demo import demo_model_path

        path = demo_model_path()
        if Path(path, "tokenizer.json").exists() or Path(path, "tokenizer_config.json").exists():
            return path
    except (ImportError, AttributeError, OSError):
        pass
    return build_fallback_tokenizer()


def build_fallback_tokenizer(path: Path = FALLBACK_DIR, vocab_size: int = 2048) -> str:
    """Train (once) a small byte-level BPE tokenizer on Python's own library sources; return its folder."""
    if (path / "tokenizer.json").exists():
        return str(path)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    print(f"benchmarks: demo tokenizer not available; building a fallback tokenizer in {path}", file=sys.stderr)
    stdlib = Path(json.__file__).parent.parent  # .../lib/python3.X
    corpus = [p.read_text(errors="ignore") for p in sorted(stdlib.glob("*.py"))[:60]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = _CHAT_TEMPLATE
    path.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(path))
    return str(path)
