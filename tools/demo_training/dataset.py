"""Token streams and seeded batches for demo-model training: raw code windows plus chat-wrapped samples.

Chat samples teach the model the ChatML layout: a user asks to continue some code, the assistant answers
with the next lines and then `<|im_end|>`, so chat answers stop on the end token.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from tools.demo_training.tokenizer_build import ENDOFTEXT

SYSTEM_PROMPTS = ("You are a helpful coding assistant.", "You write Python code.")
USER_PROMPTS = (
    "Continue this Python code:\n{code}",
    "Complete the following code.\n\n{code}",
    "What comes next?\n{code}",
    "{code}",
)


def code_stream(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> torch.Tensor:
    """All documents as one id stream, each preceded by <|endoftext|> (the document separator)."""
    sep = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    ids: list[int] = []
    for doc in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.append(sep)
        ids.extend(doc)
    return torch.tensor(ids, dtype=torch.long)


def chat_sample(rng: random.Random, text: str) -> list[dict[str, str]] | None:
    """One conversation: the user shows a few lines of `text`, the assistant continues with the next ones."""
    lines = text.splitlines(keepends=True)
    if len(lines) < 8:
        return None
    start = rng.randrange(0, len(lines) - 6)
    split = start + rng.randint(2, 10)
    end = split + rng.randint(2, 8)
    prefix, answer = "".join(lines[start:split])[-600:], "".join(lines[split:end])[:400]
    if not prefix.strip() or not answer.strip():
        return None
    messages = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    messages.append({"role": "user", "content": rng.choice(USER_PROMPTS).format(code=prefix.rstrip("\n"))})
    messages.append({"role": "assistant", "content": answer.rstrip("\n")})
    return messages


def chat_stream(
    tokenizer: PreTrainedTokenizerBase, texts: list[str], count: int, max_len: int, seed: int
) -> tuple[torch.Tensor, list[int]]:
    """`count` rendered conversations as one id stream (separated by <|endoftext|>) and their start offsets."""
    rng = random.Random(seed)
    weights = [len(t) for t in texts]
    rendered: list[str] = []
    while len(rendered) < count:
        messages = chat_sample(rng, rng.choices(texts, weights=weights)[0])
        if messages is not None:
            rendered.append(tokenizer.apply_chat_template(messages, tokenize=False))
    sep = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    ids: list[int] = []
    starts: list[int] = []
    for conv in tokenizer(rendered, add_special_tokens=False)["input_ids"]:
        if len(conv) > max_len:  # would be cut before its <|im_end|>; the lesson is the ending
            continue
        starts.append(len(ids))
        ids.extend(conv)
        ids.append(sep)
    return torch.tensor(ids, dtype=torch.long), starts


@dataclass
class BatchSampler:
    """Seeded batches of `seq_len + 1` ids: random code windows, a `chat_fraction` of rows from chat samples."""

    code: torch.Tensor
    chat: torch.Tensor
    chat_starts: list[int]
    batch_size: int
    seq_len: int
    chat_fraction: float
    seed: int

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        # A chat row starts at a conversation; only starts that leave a full window are usable.
        self._usable_starts = [s for s in self.chat_starts if s + self.seq_len + 1 <= len(self.chat)]

    def next_batch(self) -> torch.Tensor:
        """A [batch_size, seq_len + 1] tensor; inputs are [:, :-1], targets [:, 1:]."""
        rows = []
        for _ in range(self.batch_size):
            if self._usable_starts and self._rng.random() < self.chat_fraction:
                start = self._rng.choice(self._usable_starts)
                rows.append(self.chat[start : start + self.seq_len + 1])
            else:
                start = self._rng.randrange(0, len(self.code) - self.seq_len - 1)
                rows.append(self.code[start : start + self.seq_len + 1])
        return torch.stack(rows)


def eval_windows(stream: torch.Tensor, seq_len: int, max_windows: int) -> torch.Tensor:
    """Up to `max_windows` non-overlapping windows of `seq_len + 1` ids, evenly spread over `stream`."""
    total = (len(stream) - 1) // seq_len
    picks = torch.linspace(0, total - 1, steps=min(total, max_windows)).round().long().unique()
    return torch.stack([stream[i * seq_len : i * seq_len + seq_len + 1] for i in picks.tolist()])
