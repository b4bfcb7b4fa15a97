"""The fake's token choice: the SamplingParams knobs applied to one row of logits with torch.

It stands in for the runtime's sampling layers (C++ / the PyTorch sampler), which have no Python source to
follow; greedy is decided as SamplingParams.params_imply_greedy_decoding decides it (sampling_params.py @
a98a9061d72f6fd39f5d055ebdd2c6878a100e2c).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def processed_logits(logits: torch.Tensor, sp, bad_words: Sequence[Sequence[int]], prompt: Sequence[int],
                     out: Sequence[int], eos_blocked: Sequence[int]) -> torch.Tensor:
    """Apply bias, bad words (token sequences), min_tokens and penalties (not temperature/top-k/top-p)."""
    x = logits.clone()
    if sp.embedding_bias is not None:
        x += sp.embedding_bias.to(x.dtype)
    for word in bad_words:
        if word and len(out) >= len(word) - 1 and list(out[len(out) - len(word) + 1:]) == list(word[:-1]):
            x[word[-1]] = float("-inf")
    for t in eos_blocked:
        x[t] = float("-inf")
    seen = torch.tensor(list(prompt) + list(out), dtype=torch.long)
    if sp.repetition_penalty not in (None, 1.0) and len(seen):
        vals = x[seen]
        x[seen] = torch.where(vals > 0, vals / sp.repetition_penalty, vals * sp.repetition_penalty)
    if out and (sp.presence_penalty or sp.frequency_penalty):
        counts = torch.bincount(torch.tensor(list(out)), minlength=x.numel()).to(x.dtype)
        x -= (sp.frequency_penalty or 0.0) * counts + (sp.presence_penalty or 0.0) * (counts > 0).to(x.dtype)
    return x


def is_greedy(sp) -> bool:
    """Greedy as the real runtime decides it: temperature 0, top_k 1, top_p 0, or no sampling knob given."""
    return sp.params_imply_greedy_decoding(temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k)


def choose(x: torch.Tensor, sp, generator: torch.Generator) -> int:
    """Pick the next token from processed logits `x`."""
    if is_greedy(sp):
        return int(torch.argmax(x))
    probs = torch.softmax(x / (sp.temperature if sp.temperature else 1.0), dim=-1)
    if sp.top_k:
        kth = torch.topk(probs, min(sp.top_k, probs.numel())).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if sp.top_p is not None and sp.top_p < 1.0:
        sorted_p, idx = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, 0) - sorted_p < sp.top_p * sorted_p.sum()
        mask = torch.zeros_like(probs, dtype=torch.bool)
        mask[idx[keep]] = True
        probs = torch.where(mask, probs, torch.zeros_like(probs))
    if sp.min_p:
        probs = torch.where(probs >= sp.min_p * probs.max(), probs, torch.zeros_like(probs))
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))


def top_logprobs(raw: torch.Tensor, chosen: int, k: int) -> dict:
    """{token id: (logprob, rank)} for the top k of log_softmax(raw) plus the chosen token."""
    lp = torch.log_softmax(raw.float(), dim=-1)
    order = torch.argsort(lp, descending=True)
    ranks = {int(t): r + 1 for r, t in enumerate(order[: max(k, 0)].tolist())}
    if chosen not in ranks:
        ranks[chosen] = int((lp > lp[chosen]).sum()) + 1
    return {t: (float(lp[t]), r) for t, r in ranks.items()}
