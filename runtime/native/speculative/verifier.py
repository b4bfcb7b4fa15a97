"""Verification of proposed tokens against the target model (one forward of K+1 rows).

Greedy rows (`verify_greedy`) accept the longest prefix of the proposal that equals the target's argmax
after each prefix, then take the target's own argmax: output is token-for-token what plain greedy
decoding gives. Only the K+1 argmax ids are needed, so the caller computes them where the logits are
(on the GPU) and copies back ids alone.

Sampled rows (`verify_sampled`) use speculative rejection sampling (Leviathan et al. 2023; Chen et al.
2023): draft token d with draft probability q(d) is accepted with probability min(1, p(d) / q(d)); on the
first rejection the token is drawn from the normalised residual max(0, p - q); when all K are accepted a
bonus token is drawn from the last row. Each emitted token is then distributed exactly as the target's p.
A proposer without probabilities (n-gram lookup) is deterministic: q is one-hot at its token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class Verdict:
    """Outcome for one sequence: the tokens to emit (accepted drafts, then one target token)."""

    token_ids: list[int]
    num_accepted: int  # leading draft tokens among token_ids


def verify_greedy(target_ids: Sequence[int], draft_token_ids: Sequence[int]) -> Verdict:
    """`target_ids` (K+1): the target's argmax after each prefix of the K drafts (the last: the bonus)."""
    k = len(draft_token_ids)
    assert len(target_ids) == k + 1, "one target row per draft token plus the bonus row"
    accepted = 0
    while accepted < k and target_ids[accepted] == draft_token_ids[accepted]:
        accepted += 1
    # the accepted drafts equal the target's choices: the emitted tokens are its first accepted + 1 ids
    return Verdict(list(target_ids[: accepted + 1]), accepted)


def verify_sampled(
    target_probs: torch.Tensor,
    draft_token_ids: Sequence[int],
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None,
) -> Verdict:
    """Accept a prefix of `draft_token_ids` (K) given the target's processed probabilities [K+1, V].

    `draft_probs` [K, V]: the distributions the drafts were drawn from; None: deterministic proposals.
    `target_probs` rows come from `runtime.native.sampler.processed_probs`; tensors and generator share a device.
    """
    k = len(draft_token_ids)
    assert target_probs.shape[0] == k + 1, "one target row per draft token plus the bonus row"
    for j, d in enumerate(draft_token_ids):
        p = target_probs[j]
        p_d = float(p[d])
        q_d = 1.0 if draft_probs is None else float(draft_probs[j, d])
        u = float(torch.rand((), generator=generator, device=p.device))
        if u * q_d < p_d:  # accept with probability min(1, p/q), without dividing by a tiny q
            continue
        if draft_probs is None:
            residual = p.clone()
            residual[d] = 0.0
        else:
            residual = (p - draft_probs[j].to(p.dtype)).clamp_(min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q up to rounding: nothing to correct
            residual = p
        token = int(torch.multinomial(residual, 1, generator=generator))
        return Verdict(list(draft_token_ids[:j]) + [token], j)
    token = int(torch.multinomial(target_probs[k], 1, generator=generator))
    return Verdict(list(draft_token_ids) + [token], k)
