"""Benchmark prompts: synthetic ones with exact token lengths drawn from normal distributions (as the
Triton backend's benchmark_core_model.py does), or prompts read from a JSONL file."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class Prompt:
    """One request to send: the prompt text, its length in tokens, the output length to ask for."""

    text: str
    prompt_tokens: int  # tokens of `text` alone (no special tokens, no chat template); -1: unknown
    max_tokens: int


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """A transformers tokenizer from a local folder (never downloads): the class the gateway loads
    (runtime/tokenizer.py), without AutoTokenizer's config machinery, which imports torch (3 s of CPU per
    load-generator start)."""
    from runtime.tokenizer import Tokenizer

    return Tokenizer.from_pretrained(path).hf


def word_token_ids(tokenizer: PreTrainedTokenizerBase, limit: int = 30000) -> list[int]:
    """Ids of tokens that are one ASCII word with a leading space and round-trip alone.

    Such tokens keep the re-encoded length of a decoded random sequence stable, so few corrections
    are needed to hit an exact length.
    """
    special = set(tokenizer.all_special_ids)
    ids = []
    for i in range(min(len(tokenizer), limit)):
        if i in special:
            continue
        s = tokenizer.decode([i])
        if len(s) >= 3 and s[0] == " " and s[1:].isascii() and s[1:].isalpha():
            if tokenizer.encode(s, add_special_tokens=False) == [i]:
                ids.append(i)
    if len(ids) < 16:  # an unusual vocabulary: take any non-special token, corrections do the rest
        ids = [i for i in range(min(len(tokenizer), limit)) if i not in special]
    return ids


def _exact_text(tokenizer: PreTrainedTokenizerBase, rng: random.Random, pool: list[int], n: int) -> tuple[str, int]:
    """Text that encodes to `n` tokens (without special tokens); returns (text, actual length)."""
    text = tokenizer.decode(rng.choices(pool, k=n))
    length = -1
    for _ in range(16):
        ids = tokenizer.encode(text, add_special_tokens=False)
        length = len(ids)
        if length == n:
            break
        if length > n:
            text = tokenizer.decode(ids[:n])
        else:
            text += tokenizer.decode(rng.choices(pool, k=n - length))
    return text, length


def normal_length(rng: random.Random, mean: float, std: float, minimum: int = 1) -> int:
    """A length ~ Normal(mean, std), rounded, at least `minimum` (std 0: the mean)."""
    return max(minimum, round(rng.gauss(mean, std)) if std > 0 else round(mean))


def synthetic_prompts(
    tokenizer: PreTrainedTokenizerBase,
    num: int,
    input_mean: float,
    input_std: float,
    output_mean: float,
    output_std: float,
    seed: int = 0,
) -> list[Prompt]:
    """`num` prompts of random vocabulary words; input and output lengths ~ Normal(mean, std), at least 1."""
    rng = random.Random(seed)
    pool = word_token_ids(tokenizer)
    prompts = []
    for _ in range(num):
        text, length = _exact_text(tokenizer, rng, pool, normal_length(rng, input_mean, input_std))
        prompts.append(Prompt(text, length, normal_length(rng, output_mean, output_std)))
    return prompts


def jsonl_prompts(
    path: str | Path, num: int | None, default_max_tokens: int, tokenizer: PreTrainedTokenizerBase | None = None
) -> list[Prompt]:
    """Prompts from a JSONL file: one object a line with "prompt" (or "text_input"), and optionally
    "max_tokens" (or "output_len"). `num` None: all lines."""
    prompts = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            obj = json.loads(line)
            text = obj.get("prompt", obj.get("text_input"))
            if not isinstance(text, str):
                raise ValueError(f"{path}:{line_no}: needs a string 'prompt'")
            max_tokens = int(obj.get("max_tokens", obj.get("output_len", default_max_tokens)))
            n = len(tokenizer.encode(text, add_special_tokens=False)) if tokenizer is not None else -1
            prompts.append(Prompt(text, n, max_tokens))
            if num is not None and len(prompts) >= num:
                break
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts
