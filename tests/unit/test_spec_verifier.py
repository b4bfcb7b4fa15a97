"""runtime.native.speculative.verifier and ngram: greedy acceptance is the longest agreeing prefix; rejection
sampling's emitted tokens follow the target distribution exactly (chi-square, fixed seed)."""

from __future__ import annotations

import torch
from scipy.stats import chisquare

from runtime.native.speculative import NgramProposer, verify_greedy, verify_sampled


def test_greedy_accepts_longest_agreeing_prefix_then_the_targets_token() -> None:
    target = [5, 7, 2, 9]  # argmax after each prefix of the 3 drafts, plus the bonus row
    assert verify_greedy(target, [5, 7, 1]).token_ids == [5, 7, 2]
    assert verify_greedy(target, [5, 7, 1]).num_accepted == 2
    assert verify_greedy(target, [4, 7, 2]).token_ids == [5]
    all_ok = verify_greedy(target, [5, 7, 2])
    assert (all_ok.token_ids, all_ok.num_accepted) == ([5, 7, 2, 9], 3)


def _first_token_counts(p: torch.Tensor, q: torch.Tensor | None, drafts_from_q: bool, trials: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1234)
    vocab = p.shape[-1]
    counts = torch.zeros(vocab)
    target = torch.stack([p, p])  # one draft: its row and the bonus row
    for _ in range(trials):
        draft = int(torch.multinomial(q, 1, generator=gen)) if drafts_from_q else 2
        qq = q[None] if q is not None and drafts_from_q else None
        counts[verify_sampled(target, [draft], qq, gen).token_ids[0]] += 1
    return counts


def test_rejection_sampling_with_draft_probabilities_matches_the_target() -> None:
    p = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])
    q = torch.tensor([0.3, 0.1, 0.4, 0.1, 0.1])  # a poor draft: most mass where p has little
    trials = 4000
    counts = _first_token_counts(p, q, True, trials)
    assert chisquare(counts.numpy(), (p * trials).numpy()).pvalue > 0.01
    # and it is not trivially the draft's distribution
    assert chisquare(counts.numpy(), (q * trials).numpy()).pvalue < 1e-6


def test_rejection_sampling_of_deterministic_proposals_matches_the_target() -> None:
    p = torch.tensor([0.1, 0.2, 0.5, 0.2])
    trials = 4000
    counts = _first_token_counts(p, torch.zeros(4), False, trials)  # always proposes token 2 (one-hot q)
    assert chisquare(counts.numpy(), (p * trials).numpy()).pvalue > 0.01


def test_all_accepted_draws_a_bonus_token_from_the_last_row() -> None:
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    out = verify_sampled(p, [1], None, torch.Generator().manual_seed(0))
    assert (out.token_ids, out.num_accepted) == ([1, 2], 1)


def test_rejected_token_is_never_resampled_when_the_draft_is_deterministic() -> None:
    p = torch.tensor([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]])
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        out = verify_sampled(p, [0], None, gen)  # p(0) = 0: always rejected
        assert out.num_accepted == 0 and out.token_ids[0] in (1, 2)


def test_ngram_proposes_what_followed_the_latest_match_of_the_longest_suffix() -> None:
    ngram = NgramProposer(1, 3)
    #            0  1  2  3  4  5  6  7  8  9
    tokens = [1, 2, 3, 4, 9, 2, 3, 5, 6, 2, 3]
    assert ngram.propose(tokens, 2) == [5, 6]  # "2 3" last seen at 5..6, followed by 5 6
    assert ngram.propose([7, 8, 9, 7, 8], 4) == [9, 7, 8]  # stops at the sequence's end
    assert ngram.propose([1, 2, 3], 4) == []  # no earlier occurrence
    assert NgramProposer(2, 2).propose([5, 1, 6, 1], 3) == []  # unigram match not allowed
    assert ngram.propose([4, 1, 2, 4, 1, 3, 4, 1], 1) == [3]  # the latest of two matches
