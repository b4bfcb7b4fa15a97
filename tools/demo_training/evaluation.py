"""Held-out loss, the unigram baseline it must beat, and greedy samples for the demo model's TRAINING.md."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase


@torch.no_grad()
def heldout_loss(model: PreTrainedModel, windows: torch.Tensor, batch_size: int = 16) -> float:
    """Mean next-token cross-entropy (nats) over [N, L + 1] windows."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        chunk = windows[i : i + batch_size]
        logits = model(input_ids=chunk[:, :-1]).logits.float()
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), chunk[:, 1:].reshape(-1), reduction="sum")
        total += loss.item()
        count += chunk[:, 1:].numel()
    return total / count


def unigram_loss(train: torch.Tensor, windows: torch.Tensor, vocab_size: int) -> float:
    """Cross-entropy of the held-out targets under training-set token frequencies (add-one smoothed)."""
    counts = torch.bincount(train, minlength=vocab_size).double() + 1.0
    log_probs = (counts / counts.sum()).log()
    return -log_probs[windows[:, 1:].reshape(-1)].mean().item()


def perplexity(loss: float) -> float:
    """exp(loss), the perplexity of a mean cross-entropy in nats."""
    return math.exp(loss)


@torch.no_grad()
def greedy_text(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompt: str, max_new_tokens: int
) -> tuple[str, bool]:
    """Greedy continuation of `prompt` (special tokens kept) and whether it ended on an eos token."""
    model.eval()
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=model.generation_config.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )[0, ids.size(1) :]
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    return tokenizer.decode(out, skip_special_tokens=False), bool(len(out) and int(out[-1]) in eos_ids)
