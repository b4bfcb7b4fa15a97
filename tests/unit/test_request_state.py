"""runtime/native/request_state.py: the fast lane for tokens that need no delta of their own (`add_plain_token`)."""

from __future__ import annotations

import torch

from runtime.native.request_state import RequestState
from runtime.validation import PreparedRequest
from tests.engine_harness import request

EOS = 8


def state_of(max_tokens: int, **sampling: object) -> RequestState:
    req = request("r", [1, 2, 3], max_tokens, **sampling)
    return RequestState(req, PreparedRequest([1, 2, 3], max_tokens, []), eos_token_ids=[EOS], context_window=100,
                        device=torch.device("cpu"))


def test_add_plain_token_takes_only_tokens_that_cannot_end_the_sample() -> None:
    state = state_of(5, stop_token_ids=[9], ignore_eos=False)
    assert state.token_only
    seq = state.new_sequence()
    assert not state.add_plain_token(seq, 4)  # the first token carries the prompt facts: a delta
    seq.add_sampled(4)
    state.decorate([state.add_token(seq.index, 4, 0.0, [], None, seq.num_tokens)])
    for _ in range(2):
        assert state.add_plain_token(seq, 4)
        seq.add_sampled(4)
    assert not state.add_plain_token(seq, 9) and not state.add_plain_token(seq, EOS)  # a stop id, eos
    assert state.add_plain_token(seq, 4)
    seq.add_sampled(4)
    assert not state.add_plain_token(seq, 4)  # the 5th of 5: "length"
    assert state.samples[0].num_tokens == 4 and state.samples[0].finish_reason is None
    delta = state.add_token(seq.index, 4, 0.0, [], None, seq.num_tokens)
    assert delta.finish_reason == "length" and state.usage().completion_tokens == 5


def test_requests_needing_more_than_ids_take_no_fast_lane() -> None:
    assert state_of(5, stop=["x"]).token_only  # stop strings are matched on text, in the front end
    assert not state_of(5, logprobs=1).token_only
    assert not state_of(5, n=2).token_only
    assert not state_of(5, prompt_logprobs=0).token_only
    assert not state_of(5, return_generation_logits=True).token_only
