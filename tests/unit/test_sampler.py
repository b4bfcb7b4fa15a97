"""Sampler and logits processors: exact expectations for every option."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch

from runtime.request import SamplingOptions
from runtime.native.sampler import (
    Sampler,
    SamplingRow,
    make_generator,
    processed_logits,
    processed_probs,
)

V = 10
EOS = 0


def row(
    prompt: Sequence[int] = (),
    output: Sequence[int] = (),
    generator: torch.Generator | None = None,
    bad_words: Sequence[Sequence[int]] = (),
    **options: object,
) -> SamplingRow:
    return SamplingRow(
        options=SamplingOptions(**options),  # type: ignore[arg-type]
        prompt_token_ids=list(prompt),
        output_token_ids=list(output),
        generator=generator,
        eos_token_ids=[EOS],
        bad_words_ids=bad_words,
    )


def random_logits(n: int, vocab: int = V, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def probs_logits(probs: Sequence[float]) -> torch.Tensor:
    return torch.tensor([[math.log(p) for p in probs]])


def test_greedy_is_argmax_and_logprobs_are_raw_log_softmax() -> None:
    logits = random_logits(6)
    out = Sampler()(logits, [row(temperature=0.0, logprobs=3) for _ in range(6)])
    assert out.token_ids.tolist() == logits.argmax(-1).tolist()
    raw = torch.log_softmax(logits, -1)
    torch.testing.assert_close(out.logprobs, raw.gather(1, out.token_ids[:, None]).squeeze(1))
    assert out.top_ids is not None and out.top_logprobs is not None
    assert out.top_ids.tolist() == raw.topk(3).indices.tolist()
    torch.testing.assert_close(out.top_logprobs, raw.topk(3).values)
    assert (out.top_logprobs[:, :-1] >= out.top_logprobs[:, 1:]).all()  # best first


def test_top_logprobs_width_is_the_largest_request_and_absent_when_unasked() -> None:
    logits = random_logits(3)
    out = Sampler()(logits, [row(logprobs=None), row(logprobs=0), row(logprobs=5)])
    assert out.top_ids is not None and out.top_ids.shape == (3, 5)
    out = Sampler()(logits[:2], [row(), row(logprobs=0)])
    assert out.top_ids is None and out.top_logprobs is None
    assert out.logprobs.shape == (2,)


def test_logprobs_ignore_processing() -> None:
    """Penalties, bias and temperature change the choice, not the reported (raw) logprobs."""
    logits = random_logits(2, seed=3)
    rows = [row(output=[1, 2], temperature=0.0, logit_bias={7: 100.0}, repetition_penalty=1.5,
                logprobs=2), row(temperature=0.3, logprobs=2)]
    out = Sampler()(logits, rows)
    assert out.token_ids[0].item() == 7
    raw = torch.log_softmax(logits, -1)
    torch.testing.assert_close(out.logprobs, raw.gather(1, out.token_ids[:, None]).squeeze(1))
    assert out.top_ids is not None
    assert out.top_ids.tolist() == raw.topk(2).indices.tolist()


@pytest.mark.parametrize(
    "options, output, bad_words, expected",
    [
        (dict(logit_bias={7: 100.0}), [], (), 7),
        (dict(repetition_penalty=2.0), [1], (), 2),
        (dict(presence_penalty=1.0), [1], (), 2),
        (dict(frequency_penalty=1.0), [1], (), 2),
        (dict(min_tokens=1), [], (), 1),  # eos (0) banned until one token exists
        ({}, [], [[1]], 2),
        (dict(top_k=3, top_p=0.5, min_p=0.5), [], (), 1),  # truncation never moves the argmax
    ],
)
def test_all_greedy_batch_still_applies_logits_processors(
    options: dict, output: list[int], bad_words: Sequence[Sequence[int]], expected: int
) -> None:
    """A batch of greedy rows takes its argmax from the raw logits only when nothing edits them."""
    logits = torch.tensor([[5.5, 5.0, 4.9, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    if "min_tokens" not in options:
        logits[0, EOS] = -1.0  # eos out of the way unless the case is about it
    rows = [row(output=output, bad_words=bad_words, temperature=0.0, **options), row(temperature=0.0)]
    out = Sampler()(logits.repeat(2, 1), rows)
    assert out.token_ids.tolist() == [expected, int(logits.argmax())]


def test_top_k_one_and_tiny_top_p_equal_greedy() -> None:
    logits = random_logits(32, seed=1)
    sampler = Sampler(seed=123)
    greedy = logits.argmax(-1).tolist()
    for _ in range(5):
        assert sampler(logits, [row(top_k=1) for _ in range(32)]).token_ids.tolist() == greedy
        assert sampler(logits, [row(top_p=1e-6) for _ in range(32)]).token_ids.tolist() == greedy
        assert sampler(logits, [row(min_p=0.9999) for _ in range(32)]).token_ids.tolist() == greedy


def test_temperature_scales_logits() -> None:
    logits = random_logits(2)
    probs = processed_probs(logits, [row(temperature=0.5), row(temperature=2.0)])
    torch.testing.assert_close(probs[0], torch.softmax(logits[0] / 0.5, -1))
    torch.testing.assert_close(probs[1], torch.softmax(logits[1] / 2.0, -1))


def test_top_k_top_p_min_p_truncate_exactly() -> None:
    logits = probs_logits([0.05, 0.5, 0.15, 0.3]).repeat(4, 1)
    rows = [row(top_k=2), row(top_p=0.7), row(min_p=0.2), row(top_k=3, top_p=0.85)]
    probs = processed_probs(logits, rows)
    torch.testing.assert_close(probs[0], torch.tensor([0, 0.5, 0, 0.3]) / 0.8)
    # top_p: 0.5 and 0.3 are kept (mass above them 0 and 0.5 < 0.7); 0.15 has 0.8 above it
    torch.testing.assert_close(probs[1], torch.tensor([0, 0.5, 0, 0.3]) / 0.8)
    # min_p 0.2: threshold 0.2 * 0.5 = 0.1 drops only 0.05
    torch.testing.assert_close(probs[2], torch.tensor([0, 0.5, 0.15, 0.3]) / 0.95)
    # top_k 3 keeps 0.5, 0.3, 0.15 (renormalised 0.526, 0.316, 0.158); top_p 0.85 then keeps all three
    torch.testing.assert_close(probs[3], torch.tensor([0, 0.5, 0.15, 0.3]) / 0.95)


def test_greedy_rows_get_one_hot_distributions() -> None:
    logits = random_logits(2)
    probs = processed_probs(logits, [row(temperature=0.0), row()])
    assert probs[0].tolist() == torch.nn.functional.one_hot(logits[0].argmax(), V).float().tolist()
    torch.testing.assert_close(probs[1], torch.softmax(logits[1], -1))


def test_a_row_is_processed_the_same_whatever_the_batch() -> None:
    """top_k alone takes a topk path, with top_p a sort path: both keep ties the same way."""
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0, 2.0, 0.5]])
    alone = processed_logits(logits, [row(top_k=2)])
    mixed = processed_logits(logits.repeat(2, 1), [row(top_k=2), row(top_p=0.5)])
    assert torch.equal(alone[0], mixed[0])
    assert torch.isinf(alone[0]).tolist() == [True, False, True, False, True, True]
    plain = processed_logits(logits.repeat(2, 1), [row(), row(top_p=0.5)])
    assert torch.equal(plain[0], logits[0])  # a row with top_p 1 is untouched by the sort


def test_sampling_follows_the_distribution() -> None:
    target = [0.1, 0.6, 0.3]
    n = 30000
    logits = probs_logits(target).repeat(n, 1)
    tokens = Sampler(seed=7)(logits, [row() for _ in range(n)]).token_ids
    freq = torch.bincount(tokens, minlength=3).float() / n
    for got, want in zip(freq.tolist(), target):
        assert abs(got - want) < 0.015


def test_repetition_penalty_follows_transformers() -> None:
    logits = torch.tensor([[0.5, 2.0, -1.0, 3.0, -4.0, 1.0]])
    out = processed_logits(logits, [row(prompt=[1, 4], output=[2, 2], repetition_penalty=2.0)])
    assert out[0].tolist() == [0.5, 1.0, -2.0, 3.0, -8.0, 1.0]
    # the same as transformers' processor over prompt + output
    from transformers import RepetitionPenaltyLogitsProcessor

    ref = RepetitionPenaltyLogitsProcessor(2.0)(torch.tensor([[1, 4, 2, 2]]), logits.clone())
    assert out[0].tolist() == ref[0].tolist()


def test_presence_and_frequency_penalties_count_output_only() -> None:
    logits = torch.zeros(1, 6)
    out = processed_logits(
        logits, [row(prompt=[5, 5], output=[3, 3, 3, 4], presence_penalty=0.5, frequency_penalty=0.25)]
    )
    assert out[0].tolist() == [0.0, 0.0, 0.0, -(3 * 0.25 + 0.5), -(0.25 + 0.5), 0.0]
    neg = processed_logits(logits, [row(output=[1], presence_penalty=-1.0)])  # negative: encourage
    assert neg[0].tolist() == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_logit_bias_is_added_and_can_force_a_token() -> None:
    logits = random_logits(2)
    out = processed_logits(logits, [row(logit_bias={3: 2.5, 9: -1.0, 99: 5.0}), row()])
    expected = logits.clone()
    expected[0, 3] += 2.5
    expected[0, 9] -= 1.0  # id 99 is outside the vocabulary: ignored
    torch.testing.assert_close(out, expected)
    sampler = Sampler()
    for _ in range(10):
        assert sampler(logits, [row(logit_bias={6: 100.0}), row(logit_bias={6: 100.0})]).token_ids.tolist() == [6, 6]


def test_min_tokens_masks_eos_and_stop_token_ids() -> None:
    logits = torch.tensor([[9.0, 1.0, 2.0, 8.0, 0.0]])
    options = dict(temperature=0.0, min_tokens=2, stop_token_ids=[3])
    out = processed_logits(logits, [row(output=[1], **options)])  # type: ignore[arg-type]
    assert out[0].tolist() == [-math.inf, 1.0, 2.0, -math.inf, 0.0]
    assert Sampler()(logits, [row(output=[1], **options)]).token_ids.tolist() == [2]  # type: ignore[arg-type]
    assert Sampler()(logits, [row(output=[1, 1], **options)]).token_ids.tolist() == [0]  # type: ignore[arg-type]
    # logit_bias cannot lift the mask
    forced = row(output=[], logit_bias={0: 100.0}, **options)  # type: ignore[arg-type]
    assert Sampler()(logits, [forced]).token_ids.tolist() == [2]


def test_bad_words_ban_the_completing_token() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0, 9.0, 5.0, 8.0]])
    bad = [[4], [5, 6]]
    rows = [row(output=[1], bad_words=bad), row(output=[1, 5], bad_words=bad)]
    out = processed_logits(logits.repeat(2, 1), rows)
    assert out[0].tolist() == [0.0, 1.0, 2.0, 3.0, -math.inf, 5.0, 8.0]
    assert out[1].tolist() == [0.0, 1.0, 2.0, 3.0, -math.inf, 5.0, -math.inf]
    # the match is against the output tail, not the prompt
    out = processed_logits(logits, [row(prompt=[5], output=[], bad_words=[[5, 6]])])
    assert out[0, 6].item() == 8.0


def test_fully_banned_row_falls_back_to_raw_logits() -> None:
    logits = torch.tensor([[1.0, 2.0, 0.5]])
    out = processed_logits(logits, [row(bad_words=[[0], [1], [2]])])
    assert out[0].tolist() == [1.0, 2.0, 0.5]


def test_seeded_row_is_independent_of_the_batch() -> None:
    vocab = 1000
    steps = 20

    def draw(batch: int, position: int, others_greedy: bool) -> list[int]:
        gen = make_generator(42, 0, "cpu")
        sampler = Sampler(seed=batch)  # a different shared stream in each run
        tokens = []
        for step in range(steps):
            logits = random_logits(batch, vocab, seed=step)
            mine = random_logits(1, vocab, seed=1000 + step)[0]
            logits[position] = mine
            rows = [row(temperature=0.0 if others_greedy else 1.0, top_p=0.9) for _ in range(batch)]
            rows[position] = row(generator=gen, temperature=0.8, top_k=50)
            others = [make_generator(7, i, "cpu") for i in range(batch)]
            for i in range(0, batch, 3):  # some neighbours have seeds of their own
                if i != position:
                    rows[i] = row(generator=others[i])
            tokens.append(int(sampler(logits, rows).token_ids[position]))
        return tokens

    reference = draw(1, 0, False)
    assert len(set(reference)) > 5  # really sampled
    assert draw(8, 5, False) == reference
    assert draw(33, 17, True) == reference


def test_make_generator_streams_are_distinct_and_deterministic() -> None:
    assert make_generator(None, 0, "cpu") is None
    logits = torch.zeros(1, 1000)

    def tokens(seed: int, index: int) -> list[int]:
        gen = make_generator(seed, index, "cpu")
        sampler = Sampler()
        return [int(sampler(logits, [row(generator=gen)]).token_ids[0]) for _ in range(10)]

    streams = [tokens(42, i) for i in range(4)]
    assert len({tuple(s) for s in streams}) == 4
    assert streams[2] == tokens(42, 2)
    assert tokens(43, 0) != streams[0]
    assert tokens(-1, 0) == tokens(-1, 0)  # negative seeds (OpenAI allows them) work


def test_shared_generator_is_reproducible_from_the_sampler_seed() -> None:
    logits = random_logits(16, seed=9)
    a = [Sampler(seed=5)(logits, [row() for _ in range(16)]).token_ids.tolist() for _ in range(1)]
    b = [Sampler(seed=5)(logits, [row() for _ in range(16)]).token_ids.tolist() for _ in range(1)]
    assert a == b


def test_mismatched_row_count_is_an_error() -> None:
    with pytest.raises(ValueError):
        Sampler()(random_logits(2), [row()])


def test_two_pass_argmax_is_argmax_ties_included() -> None:
    from runtime.native.sampler import two_pass_argmax

    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 640, generator=g)
    x[1, 70] = x[1, 600] = 9.0  # a tie across chunks: the lower index wins
    x[2, 130] = x[2, 131] = 9.0  # a tie inside one chunk
    x[3] = 1.0  # all equal: index 0
    x[4, 639] = 9.0  # the last one
    assert two_pass_argmax(x, 64).tolist() == x.argmax(dim=-1).tolist() == [x[0].argmax().item(), 70, 130, 0, 639]
