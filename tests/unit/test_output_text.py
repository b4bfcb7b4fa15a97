"""FrontEndText: text made in the front end from the core's token-only deltas must equal the text the engine makes
in-process (RequestState with text), for every chunking of the deltas and however late the core stops."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from runtime.output_text import FrontEndText, text_in_front_end
from runtime.request import GenerationRequest, OutputDelta, SamplingOptions, TokenLogprob
from runtime.request_state import RequestState
from runtime.tokenizer import Tokenizer
from runtime.validation import PreparedRequest
from tests.tiny_models import build_tiny_tokenizer

PROMPT = [5, 6, 7]
TEXT = "the cat sat on the mat, then the dog ran off."


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    folder: Path = tmp_path_factory.mktemp("tok")
    build_tiny_tokenizer(folder)
    return Tokenizer.from_pretrained(str(folder))


def _state(tokenizer: Tokenizer, options: SamplingOptions, max_tokens: int, makes_text: bool) -> RequestState:
    request = GenerationRequest("r", prompt_token_ids=PROMPT, sampling=options)
    return RequestState(request, PreparedRequest(PROMPT, max_tokens, []), tokenizer=tokenizer,
                        eos_token_ids=[tokenizer.eos_token_ids[0]], context_window=512, device=torch.device("cpu"),
                        makes_text=makes_text)


def _run(state: RequestState, tokens: list[int], stop_after: int | None = None) -> list[OutputDelta]:
    """Deltas of one token each until the request finishes (or `stop_after` tokens, then an abort)."""
    seq = state.new_sequence()
    deltas: list[OutputDelta] = []
    for i, token in enumerate(tokens):
        if stop_after is not None and i == stop_after:
            deltas += state.end_all("abort")
            break
        seq.add_sampled(token)
        deltas.append(state.add_token(seq.index, token, -0.5, [], None, seq.num_tokens))
        deltas[-1].logprobs = [TokenLogprob(token, -0.5, [])]
        if state.finished:
            break
    state.decorate(deltas)
    return deltas


def _chunked(deltas: list[OutputDelta], sizes: tuple[int, ...]) -> list[OutputDelta]:
    """`deltas` merged into groups of the given sizes (the last size repeats), as --stream-interval does."""
    out, i = [], 0
    for size in itertools.chain(sizes, itertools.repeat(sizes[-1])):
        if i >= len(deltas):
            return out
        group = deltas[i : i + size]
        merged = OutputDelta(request_id="r", token_ids=[t for d in group for t in d.token_ids],
                             logprobs=[lp for d in group for lp in (d.logprobs or [])], finish_reason=group[-1].finish_reason,
                             stop_reason=group[-1].stop_reason, usage=group[-1].usage,
                             cumulative_logprob=group[-1].cumulative_logprob, prompt_token_ids=group[0].prompt_token_ids)
        out.append(merged)
        i += size
    return out


def _through_front_end(tokenizer: Tokenizer, options: SamplingOptions, tokens: list[int], max_tokens: int = 40,
                       sizes: tuple[int, ...] = (1,), lag: int = 0) -> list[OutputDelta]:
    """What the front end makes of a text-less core's deltas, in groups of `sizes`, where the core runs on for `lag`
    tokens past the front end's stop-string match before its abort lands."""
    stop_after = None
    for i in range(1, len(tokens) + 1):  # the token at which the front end asks for the abort
        probe = FrontEndText(tokenizer, options, PROMPT)
        if any(probe.process(d)[1] for d in _run(_state(tokenizer, options, max_tokens, False), tokens[:i])):
            stop_after = i + lag
            break
    front, out = FrontEndText(tokenizer, options, PROMPT), []
    for delta in _chunked(_run(_state(tokenizer, options, max_tokens, False), tokens, stop_after), sizes):
        done, _ = front.process(delta)
        if done is not None:
            out.append(done)
    return out


def _summary(deltas: list[OutputDelta]) -> tuple:
    last = deltas[-1]
    return ("".join(d.text for d in deltas), [t for d in deltas for t in d.token_ids],
            [lp.token_id for d in deltas for lp in (d.logprobs or [])], last.finish_reason, last.stop_reason,
            last.usage.completion_tokens if last.usage else None, last.cumulative_logprob,
            sum(d.finish_reason is not None for d in deltas))


OPTIONS = [
    SamplingOptions(stop=["then"]),
    SamplingOptions(stop=["then"], include_stop_str_in_output=True),
    SamplingOptions(stop=["the"], min_tokens=6),
    SamplingOptions(stop=["dog", "mat"], logprobs=0),
    SamplingOptions(stop=["."]),
    SamplingOptions(),
    SamplingOptions(ignore_eos=False),
]


@pytest.mark.parametrize("options", OPTIONS, ids=range(len(OPTIONS)))
@pytest.mark.parametrize("sizes", [(1,), (2,), (3, 1), (50,)])
@pytest.mark.parametrize("lag", [0, 1, 3])
def test_front_end_text_equals_the_engines(tokenizer: Tokenizer, options: SamplingOptions, sizes: tuple[int, ...],
                                            lag: int) -> None:
    """The core goes on for `lag` tokens past the stop string before the front end's abort reaches it."""
    tokens = tokenizer.encode(TEXT, add_special_tokens=False) + [tokenizer.eos_token_ids[0]] * 2
    reference = _run(_state(tokenizer, options, 40, makes_text=True), tokens)
    assert _summary(_through_front_end(tokenizer, options, tokens, sizes=sizes, lag=lag)) == _summary(reference)
    assert all(d.text == "" for d in _run(_state(tokenizer, options, 40, False), tokens))  # the core made none


def test_a_stop_string_at_max_tokens(tokenizer: Tokenizer) -> None:
    """The token that completes the stop string is also the sample's max_tokens-th: "stop", as in the engine."""
    options = SamplingOptions(stop=["cat sat"])
    tokens = tokenizer.encode(TEXT, add_special_tokens=False)
    n = next(i for i in range(1, len(tokens)) if "cat sat" in tokenizer.decode(tokens[:i]))
    reference = _run(_state(tokenizer, options, n, True), tokens)
    assert _summary(_through_front_end(tokenizer, options, tokens, n)) == _summary(reference)


def test_only_single_samples_get_front_end_text() -> None:
    assert text_in_front_end(SamplingOptions())
    assert not text_in_front_end(SamplingOptions(n=2))
    assert not text_in_front_end(SamplingOptions(beam_width=2))


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_token_id_shows_only_when_included(tokenizer: Tokenizer, include: bool) -> None:
    tokens = tokenizer.encode(TEXT, add_special_tokens=False)
    options = SamplingOptions(stop_token_ids=[tokens[5]], include_stop_str_in_output=include, stop=["zz"])
    reference = _run(_state(tokenizer, options, 40, True), tokens)
    assert _summary(_through_front_end(tokenizer, options, tokens)) == _summary(reference)
    assert reference[-1].stop_reason == tokens[5]


def test_text_held_at_max_tokens_completes_a_stop_string(tokenizer: Tokenizer) -> None:
    """max_tokens ends the sample on half a character: its flush (U+FFFD) completes a stop string, so the finish
    becomes "stop", as in the engine."""
    half = tokenizer.hf.convert_tokens_to_ids("Ã")  # the first byte of "é" (0xC3) in byte-level BPE
    tokens = tokenizer.encode("ab", add_special_tokens=False) + [half]
    options = SamplingOptions(stop=["\ufffd"])
    reference = _run(_state(tokenizer, options, len(tokens), True), tokens)
    assert _summary(_through_front_end(tokenizer, options, tokens, len(tokens))) == _summary(reference)
    assert reference[-1].finish_reason == "stop" and reference[-1].stop_reason == "\ufffd"


@pytest.mark.parametrize("sizes", [(1,), (2,), (4,)])
def test_a_stop_string_completed_by_the_min_tokens_th_token(tokenizer: Tokenizer, sizes: tuple[int, ...]) -> None:
    tokens = tokenizer.encode(TEXT, add_special_tokens=False)
    k = next(i for i in range(1, len(tokens)) if "sat" in tokenizer.decode(tokens[:i]))
    for min_tokens in (k - 1, k, k + 1):  # the first "sat" counts from the k-th token on
        options = SamplingOptions(stop=["sat"], min_tokens=min_tokens)
        reference = _run(_state(tokenizer, options, 40, True), tokens)
        assert _summary(_through_front_end(tokenizer, options, tokens, sizes=sizes)) == _summary(reference)
