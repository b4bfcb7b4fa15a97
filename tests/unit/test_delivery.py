"""runtime/delivery.py: Mailbox and read_batches, the compact wire form of the deltas they carry, and how the
front end merges deltas that wait together (runtime.request.coalesce)."""

from __future__ import annotations

import asyncio

import msgspec
import numpy as np
import pytest

from runtime.delivery import END, Mailbox, read_batches
from runtime.errors import QueueFullError
from runtime.process.messages import StepOutputs, encoder, to_front_end
from runtime.request import OutputDelta, TokenLogprob, Usage, coalesce


async def test_read_batches_hands_out_what_is_queued_per_wake_up_until_end() -> None:
    box = Mailbox()
    exits: list[str] = []
    batches = read_batches(box, lambda: exits.append("early"))
    first = asyncio.ensure_future(batches.__anext__())
    await asyncio.sleep(0)
    assert not first.done()  # waits for the first item
    box.put_nowait(OutputDelta("r", token_ids=[1]))
    box.put_nowait(OutputDelta("r", token_ids=[2]))
    assert [d.token_ids for d in await first] == [[1], [2]]
    box.put_nowait(OutputDelta("r", token_ids=[3]))
    box.put_nowait(END)
    assert [[d.token_ids for d in b] async for b in batches] == [[[3]]]
    assert exits == []


async def test_a_refusal_is_raised_and_leaving_early_calls_back() -> None:
    box = Mailbox()
    exits: list[str] = []
    box.put_nowait(QueueFullError("full"))
    with pytest.raises(QueueFullError):
        await read_batches(box, lambda: exits.append("early")).__anext__()
    assert exits == ["early"]
    box = Mailbox()
    box.put_nowait(OutputDelta("r"))
    batches = read_batches(box, lambda: exits.append("closed"))
    await batches.__anext__()
    await batches.aclose()
    assert exits == ["early", "closed"]


async def test_a_cancelled_reader_leaves_the_mailbox_usable() -> None:
    box = Mailbox()
    waiting = asyncio.ensure_future(box.get())
    await asyncio.sleep(0)
    waiting.cancel()
    box.put_nowait(1)  # the cancelled waiter is skipped, the item stays
    assert await box.get() == 1 and box.empty()


def test_a_delta_crosses_as_an_array_and_every_field_round_trips() -> None:
    plain = OutputDelta("r", 0, [7], "a", time=1.5)
    assert msgspec.msgpack.decode(encoder.encode(plain)) == ["r", 0, [7], "a", *[None] * 10, 1.5]
    full = OutputDelta("r", 1, [7, 8], "ab", time=2.0, logprobs=[TokenLogprob(7, -0.5, [(7, -0.5)])],
                       finish_reason="stop", stop_reason="x", cumulative_logprob=-1.0, prompt_token_ids=[1, 2],
                       prompt_logprobs=[None, TokenLogprob(2, -0.1)], context_logits=np.ones((2, 3), np.float32),
                       usage=Usage(2, 2), error=None)
    back = to_front_end.decode(encoder.encode(StepOutputs([("r", [full], True)], None))).deltas[0][1][0]
    assert np.array_equal(back.context_logits, full.context_logits)
    assert msgspec.structs.replace(back, context_logits=None) == msgspec.structs.replace(full, context_logits=None)


def test_coalesce_merges_each_sequence_and_keeps_the_last_delta_last() -> None:
    lp = lambda t: TokenLogprob(t, -0.5, [(t, -0.5)])  # noqa: E731
    deltas = [OutputDelta("r", 0, [1], "a", logprobs=[lp(1)], prompt_token_ids=[9, 9], time=1.0),
              OutputDelta("r", 1, [2], "b", logprobs=[lp(2)], time=1.0),
              OutputDelta("r", 0, [3, 4], "cd", logprobs=[lp(3), lp(4)], cumulative_logprob=-1.5, time=2.0),
              OutputDelta("r", 0, [5], "e", logprobs=[lp(5)], finish_reason="stop", stop_reason=5, time=3.0),
              OutputDelta("r", 1, [6], "f", logprobs=[lp(6)], finish_reason="length", usage=Usage(2, 6), time=3.0)]
    before = msgspec.to_builtins(deltas)
    assert coalesce(deltas) == [
        OutputDelta("r", 0, [1, 3, 4, 5], "acde", logprobs=[lp(1), lp(3), lp(4), lp(5)], finish_reason="stop",
                    stop_reason=5, cumulative_logprob=-1.5, prompt_token_ids=[9, 9], time=1.0),
        OutputDelta("r", 1, [2, 6], "bf", logprobs=[lp(2), lp(6)], finish_reason="length", usage=Usage(2, 6),
                    time=1.0)]
    assert msgspec.to_builtins(deltas) == before  # the inputs are untouched


@pytest.mark.parametrize("reason", ["error", "abort"])
def test_coalesce_never_folds_tokens_into_an_error_or_abort(reason: str) -> None:
    deltas = [OutputDelta("r", 0, [1], "a"), OutputDelta("r", 0, [2], "b"),
              OutputDelta("r", 0, finish_reason=reason, error="boom" if reason == "error" else None)]
    assert coalesce(deltas) == [OutputDelta("r", 0, [1, 2], "ab"), deltas[2]]


def test_coalesce_leaves_a_single_delta_alone() -> None:
    one = [OutputDelta("r", 0, [1], "a")]
    assert coalesce(one) is one
