"""runtime/output_processor.py: the text of a backend's token-level deltas. Stop strings cut text, ids, logprobs and
usage where they match (after min_tokens), the same for every chunking of the deltas and however late the backend
ends the sample; one sample of several ends alone; stop tokens show their text only when asked."""

from __future__ import annotations

import itertools

import pytest
import torch

from runtime.output_processor import OutputProcessor
from runtime.request import GenerationRequest, OutputDelta, SamplingOptions, TokenLogprob, Usage
from runtime.native.request_state import RequestState
from runtime.tokenizer import Tokenizer
from runtime.validation import PreparedRequest

PROMPT = [5, 6, 7]
TEXT = "the cat sat on the mat, then the dog ran off."


def _state(tokenizer: Tokenizer, options: SamplingOptions, max_tokens: int) -> RequestState:
    request = GenerationRequest("r", prompt_token_ids=PROMPT, sampling=options)
    return RequestState(request, PreparedRequest(PROMPT, max_tokens, []), eos_token_ids=[tokenizer.eos_token_ids[0]],
                        context_window=512, device=torch.device("cpu"))


def _core(state: RequestState, tokens: list[int], stop_after: int | None = None) -> list[OutputDelta]:
    """The core's deltas of one token each until the request finishes (or `stop_after` tokens, then the abort of a
    stop string matched in the front end)."""
    deltas: list[OutputDelta] = []
    for i, token in enumerate(tokens):
        if stop_after is not None and i == stop_after:
            deltas += state.end_all("abort")
            break
        deltas.append(state.add_token(0, token, -0.5, [], None, len(PROMPT) + i + 1))
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


def _through(tokenizer: Tokenizer, options: SamplingOptions, tokens: list[int], max_tokens: int = 40,
             sizes: tuple[int, ...] = (1,), lag: int = 0) -> list[OutputDelta]:
    """What the front end makes of the core's deltas, in groups of `sizes`, where the core runs on for `lag` tokens
    past the front end's stop-string match before its abort lands."""
    processor = OutputProcessor(tokenizer)
    request = GenerationRequest("r", prompt_token_ids=PROMPT, sampling=options)
    stop_after = None
    for i in range(1, len(tokens) + 1):  # the token at which the front end asks for the abort
        probe = processor.add_request(request, PROMPT)
        if probe.process(_core(_state(tokenizer, options, max_tokens), tokens[:i]))[1]:
            stop_after = i + lag
            break
    text = processor.add_request(request, PROMPT)
    out: list[OutputDelta] = []
    for delta in _chunked(_core(_state(tokenizer, options, max_tokens), tokens, stop_after), sizes):
        done, _ = text.process([delta])
        out += done
    return out


def _summary(deltas: list[OutputDelta]) -> tuple:
    last = deltas[-1]
    return ("".join(d.text for d in deltas), [t for d in deltas for t in d.token_ids],
            [lp.token_id for d in deltas for lp in (d.logprobs or [])], last.finish_reason, last.stop_reason,
            last.usage.completion_tokens if last.usage else None, last.cumulative_logprob,
            sum(d.finish_reason is not None for d in deltas))


def _tokens(tokenizer: Tokenizer) -> list[int]:
    return tokenizer.encode(TEXT, add_special_tokens=False) + [tokenizer.eos_token_ids[0]] * 2


def _upto(tokenizer: Tokenizer, tokens: list[int], text: str) -> int:
    """How many of `tokens` it takes for their text to hold `text`."""
    return next(i for i in range(1, len(tokens) + 1) if text in tokenizer.decode(tokens[:i]))


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
@pytest.mark.parametrize("sizes", [(2,), (3, 1), (50,)])
@pytest.mark.parametrize("lag", [0, 1, 3])
def test_the_text_does_not_depend_on_chunking_or_on_when_the_core_stops(tokenizer: Tokenizer, options: SamplingOptions,
                                                                         sizes: tuple[int, ...], lag: int) -> None:
    """The core goes on for `lag` tokens past the stop string before the front end's abort reaches it."""
    tokens = _tokens(tokenizer)
    one_by_one = _through(tokenizer, options, tokens)
    assert _summary(_through(tokenizer, options, tokens, sizes=sizes, lag=lag)) == _summary(one_by_one)


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_string_cuts_text_ids_logprobs_and_usage(tokenizer: Tokenizer, include: bool) -> None:
    tokens = _tokens(tokenizer)
    kept = _upto(tokenizer, tokens, "then")
    deltas = _through(tokenizer, SamplingOptions(stop=["then"], include_stop_str_in_output=include, logprobs=0),
                      tokens, lag=3)
    text, ids, logprob_ids, finish, stop_reason, completion_tokens, cumulative, finishes = _summary(deltas)
    assert text == ("the cat sat on the mat, then" if include else "the cat sat on the mat, ")
    assert ids == logprob_ids == tokens[:kept] and completion_tokens == kept
    assert (finish, stop_reason, finishes) == ("stop", "then", 1) and cumulative == pytest.approx(-0.5 * kept)


def test_without_stops_the_text_is_the_decoded_ids(tokenizer: Tokenizer) -> None:
    tokens = _tokens(tokenizer)
    deltas = _through(tokenizer, SamplingOptions(ignore_eos=False), tokens)
    assert "".join(d.text for d in deltas) == TEXT  # eos ended it: in the ids, not in the text
    assert [t for d in deltas for t in d.token_ids] == tokens[:-1]
    assert (deltas[-1].finish_reason, deltas[-1].stop_reason, deltas[-1].usage) == ("stop", None, Usage(3, len(tokens) - 1))


def test_a_stop_string_at_max_tokens(tokenizer: Tokenizer) -> None:
    """The token that completes the stop string is also the sample's max_tokens-th: "stop" on the string."""
    tokens = tokenizer.encode(TEXT, add_special_tokens=False)
    n = _upto(tokenizer, tokens, "cat sat")
    deltas = _through(tokenizer, SamplingOptions(stop=["cat sat"]), tokens, n)
    assert _summary(deltas)[:6] == ("the ", tokens[:n], tokens[:n], "stop", "cat sat", n)


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_token_id_shows_only_when_included(tokenizer: Tokenizer, include: bool) -> None:
    tokens = tokenizer.encode(TEXT, add_special_tokens=False)
    options = SamplingOptions(stop_token_ids=[tokens[5]], include_stop_str_in_output=include, stop=["zz"])
    deltas = _through(tokenizer, options, tokens)
    shown = tokens[:6] if include else tokens[:5]
    assert _summary(deltas)[:6] == (tokenizer.decode(shown), tokens[:6], tokens[:6], "stop", tokens[5], 6)


def test_eos_shows_no_text_even_when_stop_strings_are_included(tokenizer: Tokenizer) -> None:
    """include_stop_str_in_output shows stop strings and stop token ids, never eos (its text would be special)."""
    eos = tokenizer.eos_token_ids[0]
    options = SamplingOptions(ignore_eos=False, include_stop_str_in_output=True, skip_special_tokens=False)
    deltas = _through(tokenizer, options, tokenizer.encode("the cat", add_special_tokens=False) + [eos])
    assert "".join(d.text for d in deltas) == "the cat" and deltas[-1].stop_reason is None


def test_text_held_at_max_tokens_completes_a_stop_string(tokenizer: Tokenizer) -> None:
    """max_tokens ends the sample on half a character: its flush (U+FFFD) completes a stop string, so the finish
    becomes "stop"."""
    half = tokenizer.hf.convert_tokens_to_ids("Ã")  # the first byte of "é" (0xC3) in byte-level BPE
    tokens = tokenizer.encode("ab", add_special_tokens=False) + [half]
    deltas = _through(tokenizer, SamplingOptions(stop=["\ufffd"]), tokens, len(tokens))
    assert _summary(deltas)[:5] == ("ab", tokens, tokens, "stop", "\ufffd")


@pytest.mark.parametrize("sizes", [(1,), (2,), (4,)])
def test_a_stop_string_counts_from_the_min_tokens_th_token(tokenizer: Tokenizer, sizes: tuple[int, ...]) -> None:
    tokens = tokenizer.encode(TEXT, add_special_tokens=False)
    k = _upto(tokenizer, tokens, "sat")
    # from min_tokens k + 1 on, the only "sat" is not looked at: the sample runs to max_tokens
    for min_tokens, kept in ((k - 1, k), (k, k), (k + 1, len(tokens))):
        options = SamplingOptions(stop=["sat"], min_tokens=min_tokens)
        deltas = _through(tokenizer, options, tokens, max_tokens=len(tokens), sizes=sizes)
        assert [t for d in deltas for t in d.token_ids] == tokens[:kept], min_tokens


def test_one_sample_of_several_ends_on_its_stop_string_alone(tokenizer: Tokenizer) -> None:
    """n = 2: sample 1 completes "sat" and is aborted alone (the core sends one more of its tokens first); its cut
    delta goes out with the core's abort; sample 0 runs on; usage leaves out the dropped token."""
    cat, dog = (tokenizer.encode(t, add_special_tokens=False) for t in ("the cat sat on", "a dog ran far away from the big house"))
    options = SamplingOptions(n=2, stop=["sat"])
    request = GenerationRequest("r", prompt_token_ids=PROMPT, sampling=options)
    text = OutputProcessor(tokenizer).add_request(request, PROMPT)
    core = _state(tokenizer, options, 40)
    out: list[OutputDelta] = []
    aborted: list[int] = []
    k = _upto(tokenizer, cat, "sat")
    for i in range(k + 1):  # the core is one token late with the abort
        step = [core.add_token(0, dog[i], 0.0, [], None, 4 + i), core.add_token(1, cat[i], 0.0, [], None, 4 + i)]
        core.decorate(step)
        done, stopped = text.process(step)
        out += done
        aborted += stopped
    assert aborted == [1]
    step = [core.end_sample(1, "abort")]
    step += [core.add_token(0, token, 0.0, [], None, 9) for token in dog[k + 1:]] + core.end_all("length")
    core.decorate(step)
    out += text.process(step)[0]
    by_index = {i: [d for d in out if d.index == i] for i in (0, 1)}
    assert "".join(d.text for d in by_index[1]) == "the cat " and by_index[1][-1].stop_reason == "sat"
    assert [t for d in by_index[1] for t in d.token_ids] == cat[:k]
    assert "".join(d.text for d in by_index[0]) == "a dog ran far away from the big house"
    assert out[-1].usage == Usage(3, len(dog) + k)  # the core counted k + 1 tokens of sample 1


def test_whole_outputs_at_once_as_beams_come(tokenizer: Tokenizer) -> None:
    tokens = tokenizer.encode("the cat", add_special_tokens=False)
    eos = tokenizer.eos_token_ids[0]
    request = GenerationRequest("r", prompt_token_ids=PROMPT, sampling=SamplingOptions(beam_width=2))
    beams = [OutputDelta("r", 0, tokens + [eos], finish_reason="stop"),
             OutputDelta("r", 1, tokens, finish_reason="length", usage=Usage(3, 2 * len(tokens) + 1))]
    out, stopped = OutputProcessor(tokenizer).add_request(request, PROMPT).process(beams)
    assert [d.text for d in out] == ["the cat", "the cat"] and not stopped


def test_tensorrt_llm_deltas_show_every_id(tokenizer: Tokenizer) -> None:
    """TensorRT-LLM leaves a stop token out of its ids unless include_stop_str_in_output: every id it sends shows."""
    tokens = tokenizer.encode("the cat sat", add_special_tokens=False)
    request = GenerationRequest("r", prompt_token_ids=PROMPT, sampling=SamplingOptions(include_stop_str_in_output=True))
    delta = OutputDelta("r", 0, tokens, finish_reason="stop", stop_reason=tokens[-1], usage=Usage(3, len(tokens)))
    out, _ = OutputProcessor(tokenizer, hides_stop_tokens=False).add_request(request, PROMPT).process([delta])
    assert out[0].text == "the cat sat"
