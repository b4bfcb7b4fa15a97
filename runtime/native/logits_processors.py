"""Logits processors: per-request edits to a batch of logits before a token is chosen.

All functions work in place on float logits [N, V] (row i belongs to rows[i]) and touch only the rows
whose option is active. Order (as `apply_logits_processors` runs them):

1. repetition penalty (transformers' semantics, over prompt + output tokens): a seen token's logit is
   divided by the penalty when positive, multiplied by it when negative;
2. presence and frequency penalties (OpenAI's semantics, over output tokens only):
   logit -= frequency_penalty * count + presence_penalty * (count > 0);
3. logit_bias: added to the logits (ids outside the vocabulary are ignored; the adapters validate);
4. min_tokens: while fewer than min_tokens tokens were generated, eos ids and stop_token_ids get -inf;
5. bad words: a bad-word sequence's last token gets -inf when the output ends with the rest of it
   (single-token bad words are always banned).
The -inf masks come last so that no bias or penalty can lift them.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import TYPE_CHECKING

import torch

from runtime.native.device import host_tensor

if TYPE_CHECKING:
    from runtime.native.sampler import SamplingRow


def apply_logits_processors(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Run every processor on `logits` (in place) and return it."""
    apply_repetition_penalty(logits, rows)
    apply_presence_frequency_penalties(logits, rows)
    apply_logit_bias(logits, rows)
    apply_min_tokens(logits, rows)
    apply_bad_words(logits, rows)
    return logits


def token_counts(histories: Sequence[Sequence[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
    """Float [len(histories), vocab_size]: how often each token occurs in each history.

    Built with one scatter-add over the flattened histories, so the cost is linear in their total length.
    """
    counts = torch.zeros(len(histories), vocab_size, dtype=torch.float32, device=device)
    lengths = [len(h) for h in histories]
    if sum(lengths) == 0:
        return counts
    flat = torch.tensor(list(chain.from_iterable(histories)), dtype=torch.long, device=device)
    row = torch.repeat_interleave(
        torch.arange(len(histories), device=device), torch.tensor(lengths, device=device)
    )
    counts.index_put_((row, flat), torch.ones_like(flat, dtype=torch.float32), accumulate=True)
    return counts


def apply_repetition_penalty(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """Divide positive / multiply negative logits of tokens seen in prompt or output by the penalty."""
    idx = [i for i, r in enumerate(rows) if r.options.repetition_penalty != 1.0]
    if not idx:
        return
    device = logits.device
    histories = [list(rows[i].prompt_token_ids) + list(rows[i].output_token_ids) for i in idx]
    seen = token_counts(histories, logits.shape[-1], device) > 0
    penalty = torch.tensor([rows[i].options.repetition_penalty for i in idx], device=device)[:, None]
    index = torch.tensor(idx, device=device)
    sub = logits.index_select(0, index)
    penalized = torch.where(sub > 0, sub / penalty, sub * penalty)
    logits.index_copy_(0, index, torch.where(seen, penalized, sub))


def apply_presence_frequency_penalties(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """Subtract frequency * count + presence * (count > 0), counting output tokens only."""
    idx = [
        i
        for i, r in enumerate(rows)
        if (r.options.presence_penalty != 0.0 or r.options.frequency_penalty != 0.0) and r.output_token_ids
    ]
    if not idx:
        return
    device = logits.device
    counts = token_counts([rows[i].output_token_ids for i in idx], logits.shape[-1], device)
    freq = torch.tensor([rows[i].options.frequency_penalty for i in idx], device=device)[:, None]
    pres = torch.tensor([rows[i].options.presence_penalty for i in idx], device=device)[:, None]
    index = torch.tensor(idx, device=device)
    logits.index_add_(0, index, -(freq * counts + pres * (counts > 0).float()))


def apply_logit_bias(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """Add each row's logit_bias {token id: bias} to its logits."""
    vocab = logits.shape[-1]
    r_idx: list[int] = []
    t_idx: list[int] = []
    bias: list[float] = []
    for i, r in enumerate(rows):
        for tok, b in r.options.logit_bias.items():
            tok = int(tok)
            if 0 <= tok < vocab:
                r_idx.append(i)
                t_idx.append(tok)
                bias.append(float(b))
    if r_idx:
        _put(logits, r_idx, t_idx, host_tensor(bias, logits.dtype, logits.device), add=True)


def apply_min_tokens(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """Ban eos ids and stop_token_ids until a row has generated min_tokens tokens."""
    r_idx: list[int] = []
    t_idx: list[int] = []
    for i, r in enumerate(rows):
        if len(r.output_token_ids) < r.options.min_tokens:
            banned = set(r.eos_token_ids) | set(r.options.stop_token_ids)
            r_idx.extend([i] * len(banned))
            t_idx.extend(banned)
    _ban(logits, r_idx, t_idx)


def apply_bad_words(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """Ban the token that would complete a bad-word sequence at the end of the output."""
    r_idx: list[int] = []
    t_idx: list[int] = []
    for i, r in enumerate(rows):
        if not r.bad_words_ids:
            continue
        out = r.output_token_ids
        for word in r.bad_words_ids:
            if not word:
                continue
            head = list(word[:-1])
            if not head or (len(out) >= len(head) and list(out[len(out) - len(head) :]) == head):
                r_idx.append(i)
                t_idx.append(int(word[-1]))
    _ban(logits, r_idx, t_idx)


def _ban(logits: torch.Tensor, r_idx: list[int], t_idx: list[int]) -> None:
    keep = [(r, t) for r, t in zip(r_idx, t_idx) if 0 <= t < logits.shape[-1]]
    if keep:
        rs, ts = zip(*keep)
        value = torch.full((len(keep),), float("-inf"), dtype=logits.dtype, device=logits.device)
        _put(logits, list(rs), list(ts), value, add=False)


def _put(logits: torch.Tensor, r_idx: list[int], t_idx: list[int], values: torch.Tensor, add: bool) -> None:
    device = logits.device
    index = (host_tensor(r_idx, torch.long, device), host_tensor(t_idx, torch.long, device))
    logits.index_put_(index, values, accumulate=add)
