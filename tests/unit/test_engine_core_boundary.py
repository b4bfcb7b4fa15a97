"""The engine core's message boundary (runtime/native/core_process.py): nothing inside one request ends the core.

The test is the front end: it binds the sockets, starts a real core process over the tiny model and sends it
AddRequest messages of its own making, every field (and every nested field) replaced in turn by a value of a
wrong type or shape, or left out. Each must fail alone (a typed refusal, or a request that runs and ends
normally), and the core must stay alive and serve a good request exactly as before. Before the fix, the first
such message (a JSON schema that is a number: a Triton `guided_decoding` of "1") ended the core.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from runtime.config import EngineConfig
from runtime.native.core_process import Addresses, CoreArgs
from runtime.process.launcher import launch
from runtime.process.messages import (
    AddRequest, Attach, ErrorInfo, Ready, Rejected, StepOutputs, _with_header, to_front_end,
)
from runtime.request import GenerationRequest, GuidedDecoding, LoraTask, SamplingOptions
from tests.tiny_models import build_tiny_model

ENGINE = dict(device="cpu", dtype="float32", kv_block_size=4, max_kv_tokens=1024, max_batch_size=8,
              max_model_len=128)
GOOD_PROMPT = [5, 6, 7, 8]


class CoreDriver:
    """A front end of one: the sockets, the core process, and what the core answered per request id."""

    def __init__(self, checkpoint: Path, folder: Path) -> None:
        addresses = Addresses(f"ipc://{folder}/to-core", f"ipc://{folder}/to-front-end")
        self._context = zmq.Context()
        self._sender = self._context.socket(zmq.PUSH)
        self._sender.bind(addresses.to_core)
        self._receiver = self._context.socket(zmq.PULL)
        self._receiver.bind(addresses.to_front_end)
        config = EngineConfig(model=str(checkpoint), **ENGINE)
        args = CoreArgs(config, [addresses], os.getpid(), logging.CRITICAL)
        self.process = launch("engine-core", "runtime.native.core_process:run", msgspec.msgpack.encode(args))
        self.outcomes: dict[str, Any] = {}  # request id -> ErrorInfo (refused) or its deltas' finish reasons
        self.tokens: dict[str, list[int]] = {}
        self.readies = 0
        if not self.wait(lambda: self.readies == 1, 120.0):  # (start-up Phase messages come first)
            self.close()
            raise AssertionError("the core did not say Ready")

    def _next(self, timeout: float) -> Any:
        if not self._receiver.poll(int(timeout * 1000)):
            return None
        return to_front_end.decode(self._receiver.recv())

    def send(self, data: bytes) -> None:
        self._sender.send(data)

    def outcome(self, request_id: str, timeout: float = 30.0) -> Any:
        """The request's refusal (ErrorInfo) or the finish reasons of its samples; None past `timeout`."""
        self.wait(lambda: request_id in self.outcomes, timeout)
        return self.outcomes.get(request_id)

    def wait(self, done: Any, timeout: float = 30.0) -> bool:
        """Read the core's messages until `done()` (True) or `timeout` (False)."""
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            msg = self._next(max(0.0, deadline - time.monotonic()))
            if isinstance(msg, Ready):
                self.readies += 1
            elif isinstance(msg, Rejected):
                self.outcomes[msg.request_id] = msg.error
            elif isinstance(msg, StepOutputs):
                for rid, token_id in zip(msg.token_requests, msg.token_ids):
                    self.tokens.setdefault(rid, []).append(token_id)
                for rid, deltas, final in msg.deltas:
                    for delta in deltas:
                        self.tokens.setdefault(rid, []).extend(delta.token_ids)
                    reasons = [d.finish_reason for d in deltas if d.finish_reason is not None]
                    self.outcomes.setdefault(f"{rid} reasons", []).extend(reasons)
                    if final:
                        self.outcomes[rid] = self.outcomes.pop(f"{rid} reasons")
        return done()

    def close(self) -> None:
        self.process.kill()
        self.process.wait(10)
        self._sender.close(linger=0)
        self._receiver.close(linger=0)
        self._context.term()


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoreDriver]:
    checkpoint = build_tiny_model(tmp_path_factory.mktemp("boundary"), "llama")
    driver = CoreDriver(checkpoint, tmp_path_factory.mktemp("sockets"))
    yield driver
    driver.close()


def add_request(request_id: str, request: GenerationRequest, prompt: list[int], max_tokens: int,
                bad_words_ids: list[list[int]] | None = None) -> dict[str, Any]:
    """An AddRequest as plain msgpack values (what the test then breaks)."""
    request.request_id = request_id
    msg = AddRequest(request, prompt, max_tokens, bad_words_ids or [])
    return msgspec.to_builtins(msg)


def good(request_id: str) -> dict[str, Any]:
    return add_request(request_id, GenerationRequest(
        "", sampling=SamplingOptions(max_tokens=6, temperature=0.0, ignore_eos=True)), GOOD_PROMPT, 6)


BASES = {  # every field of AddRequest and of what it holds appears in at least one of these
    "plain": lambda rid: good(rid),
    "options": lambda rid: add_request(rid, GenerationRequest(
        "", prompt="x", prompt_token_ids=[1, 2], adapter=None, num_draft_tokens=1, deadline=time.monotonic() + 60,
        sampling=SamplingOptions(max_tokens=3, temperature=0.7, top_k=5, top_p=0.9, min_p=0.1, repetition_penalty=1.1,
                                 presence_penalty=0.5, frequency_penalty=0.5, min_tokens=1, logit_bias={5: 2.0},
                                 bad_words=["a"], seed=3, stop=["zz"], stop_token_ids=[3], logprobs=2,
                                 prompt_logprobs=1, n=2, return_context_logits=True,
                                 return_generation_logits=True)), [9, 10, 11], 3, [[7], [8, 9]]),
    "guided": lambda rid: add_request(rid, GenerationRequest("", sampling=SamplingOptions(max_tokens=4), guided=(
        GuidedDecoding(json_schema={"type": "object", "properties": {"a": {"type": "integer"}}}))), [12, 13], 4),
    "regex": lambda rid: add_request(rid, GenerationRequest("", sampling=SamplingOptions(max_tokens=4), guided=(
        GuidedDecoding(regex="[ab]+", structural_tag={"type": "structural_tag"}))), [12, 13], 4),
    "beams": lambda rid: add_request(rid, GenerationRequest("", sampling=SamplingOptions(
        max_tokens=3, beam_width=2, length_penalty=1.0)), [14, 15], 3),
    "lora_task": lambda rid: add_request(rid, GenerationRequest("", sampling=SamplingOptions(max_tokens=2),
                                                                lora_task=LoraTask(7, [[1.0]], [[0, 0, 1]])), [3], 2),
}


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a message: each key of each object, the first element of each list."""
    if isinstance(value, dict):
        for key, sub in value.items():
            yield (*prefix, key)
            yield from paths(sub, (*prefix, key))
    elif isinstance(value, list) and value:
        yield (*prefix, 0)
        yield from paths(value[0], (*prefix, 0))


# (a request id or front end that is wrong names nobody to answer: test_messages_naming_no_request_...)
PLACES = [(base, path) for base, make in BASES.items() for path in paths(make("x"))
          if path[-1] != "request_id" and path != ("front_end",)]

_ext = st.builds(msgspec.msgpack.Ext, st.sampled_from([1, 2, 7]), st.one_of(st.binary(max_size=24), st.sampled_from([
    _with_header("int32", [2], b"abcd"), _with_header("float32", [2**31 - 1], b"ab"), _with_header("bool", [1], b"\1"),
    _with_header("nonsense", [1], b"a"), _with_header("float32", [-1], b"abcd")])))
_scalar = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(), st.text(max_size=8),
                    st.binary(max_size=8), _ext)
WRONG = st.one_of(_scalar, st.recursive(_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.one_of(st.text(max_size=4), st.integers(-5, 5)), inner,
                                                 max_size=3)), max_leaves=8),
    st.just([[[[[[[[[[[]]]]]]]]]]]), st.just({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}))
# right types, values at and past every edge
EXTREME = st.sampled_from([-2**63, -2**31, -1, 0, 1, 2**31, 2**63 - 1, 2**64 - 1, float("nan"), float("inf"),
                           -float("inf"), 1e308, -1e-308, "", "\x00", "x" * 10_000, [], [-1], [2**63 - 1], [[]], {},
                           {"": None}, {-1: 1.0}, {2**40: float("nan")}, [0] * 5000])
DELETE = object()


def broken(base: str, path: tuple[Any, ...], value: Any, request_id: str) -> bytes:
    msg = BASES[base](request_id)
    parent = msg
    for step in path[:-1]:
        parent = parent[step]
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return msgspec.msgpack.encode(msg)


def check_still_serving(core: CoreDriver, request_id: str, want: list[int]) -> None:
    core.send(msgspec.msgpack.encode(good(request_id)))
    assert core.outcome(request_id) == ["length"], "the core stopped serving"
    assert core.tokens[request_id] == want
    assert core.process.poll() is None


def reference(core: CoreDriver) -> list[int]:
    """The good request's tokens, once."""
    if "reference" not in core.outcomes:
        core.send(msgspec.msgpack.encode(good("reference")))
        assert core.outcome("reference") == ["length"]
    return core.tokens["reference"]


def test_a_triton_schema_that_is_a_number_is_refused_alone(core: CoreDriver) -> None:
    """The probe's case: `guided_decoding: "1"` reached the core as json_schema=1, and the core exited."""
    want = reference(core)
    core.send(broken("guided", ("request", "guided", "json_schema"), 1, "number-schema"))
    refusal = core.outcome("number-schema")
    assert isinstance(refusal, ErrorInfo) and refusal.type == "InvalidRequestError"
    assert refusal.attrs["param"] == "json_schema" and "got `int`" in refusal.message
    check_still_serving(core, "after-number-schema", want)


def test_messages_naming_no_request_or_no_front_end_are_dropped(core: CoreDriver) -> None:
    want = reference(core)
    core.send(b"\xc1 not msgpack")
    core.send(msgspec.msgpack.encode([1, 2, 3]))
    core.send(broken("plain", ("request", "request_id"), 12, "ignored"))
    core.send(broken("plain", ("front_end",), 3, "unknown-front-end"))  # a front end that does not exist
    core.send(broken("plain", ("front_end",), -1, "negative-front-end"))
    check_still_serving(core, "after-unaddressed", want)
    assert "unknown-front-end" not in core.outcomes and "negative-front-end" not in core.outcomes


def test_a_front_end_attaching_again_gets_ready_and_what_its_earlier_process_left_is_aborted(
        core: CoreDriver) -> None:
    """A restarted front end (--api-servers) attaches under the index of the dead one."""
    want = reference(core)
    left = good("left-behind")
    left["max_tokens"] = left["request"]["sampling"]["max_tokens"] = 100
    core.send(msgspec.msgpack.encode(left))
    assert core.wait(lambda: len(core.tokens.get("left-behind", [])) >= 2)  # running
    readies = core.readies
    core.send(msgspec.msgpack.encode(Attach(0)))
    assert core.outcome("left-behind") == ["abort"] and len(core.tokens["left-behind"]) < 100
    assert core.wait(lambda: core.readies == readies + 1)
    check_still_serving(core, "after-attach", want)


_counter = iter(range(10**9))


@settings(max_examples=1000, deadline=None, derandomize=True, database=None, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(place=st.sampled_from(PLACES), value=st.one_of(WRONG, EXTREME, st.just(DELETE)))
def test_every_field_of_a_request_with_a_wrong_type_or_shape_fails_alone(core: CoreDriver, place: tuple[str, Any],
                                                                         value: Any) -> None:
    base, path = place
    n = next(_counter)
    request_id = f"fuzz-{n}"
    core.send(broken(base, path, value, request_id))
    if path == ("request",):  # no request id left to answer: dropped
        outcome = core.outcome(request_id, timeout=0.2)
        assert outcome is None
        return
    outcome = core.outcome(request_id, timeout=20.0)
    assert outcome is not None, f"{base} {path}={value!r}: no answer"
    if isinstance(outcome, ErrorInfo):  # refused: typed, never an engine failure
        assert outcome.type != "EngineFailedError", f"{base} {path}={value!r}: {outcome.message}"
    else:  # accepted: it ran and ended normally
        assert "error" not in outcome, f"{base} {path}={value!r}: {outcome}"
    if n % 10 == 0:
        check_still_serving(core, f"good-{n}", reference(core))
    assert core.process.poll() is None
