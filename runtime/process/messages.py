"""What the front end and the engine-core process say to each other, and how it is encoded (msgpack).

Front end -> core: `AddRequest` (a request already tokenized and validated by the front end), `Abort` (of requests,
or of one sample whose stop string the front end matched), `LoraCall` (load/unload an adapter), `Shutdown`,
`Attach` (a front end that did not start the core, or was restarted, says it is there: the core answers `Ready`).
With --api-servers N there are N front ends; each request's outputs go back to the one that sent it.
Core -> front end: `Ready` (or `StartFailed`) once, then `StepOutputs` (one per engine step that produced
anything: every request's new deltas or token ids, and the engine's stats at most every STATS_PERIOD s),
`Rejected` (a request the core refused after it was handed over: queue full, grammar, adapter), `LoraReply`,
`Phase` (what a starting or warming core is doing, for /health).

The request/delta dataclasses of runtime.request travel as they are (msgspec encodes dataclasses); numpy arrays
(context/generation logits, Triton LoRA weights) travel as msgpack extensions. Nothing here needs torch: the front
end never loads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import msgspec
import numpy as np

from runtime import errors
from runtime.config import EngineConfig
from runtime.engine import EngineStats
from runtime.request import GenerationRequest, OutputDelta

STATS_PERIOD = 0.05  # s between stats updates while the core is busy
_NDARRAY = 2  # msgpack extension code


@dataclass(frozen=True)
class Addresses:
    """ZeroMQ endpoints, bound by the front end."""

    to_core: str  # requests, aborts, LoRA calls, shutdown
    to_front_end: str  # step outputs and replies


@dataclass(frozen=True)
class CoreArgs:
    """What the front end hands the core on its stdin."""

    config: EngineConfig
    addresses: list[Addresses]  # one pair per front end (--api-servers)
    parent_pid: int
    log_level: int


class ErrorInfo(msgspec.Struct):
    """A runtime.errors exception: its class name, message and attributes (param, ...)."""

    type: str
    message: str
    attrs: dict[str, Any] = {}


class AddRequest(msgspec.Struct, tag="add"):
    request: GenerationRequest
    prompt_token_ids: list[int]
    max_tokens: int
    bad_words_ids: list[list[int]]
    front_end: int = 0  # which front end sent it: its outputs go back there


class Abort(msgspec.Struct, tag="abort"):
    request_ids: list[str]
    index: int | None = None  # None: the whole requests; else only that sample of each (a stop string matched)


class LoraCall(msgspec.Struct, tag="lora"):
    call_id: int
    name: str
    path: str | None  # None: unload
    front_end: int = 0


class Shutdown(msgspec.Struct, tag="shutdown"):
    drain_timeout: float


class Attach(msgspec.Struct, tag="attach"):
    """Front end `front_end` starts (a restarted one too): what an earlier process of that front end left
    running is aborted, and the core answers Ready."""

    front_end: int


class Ready(msgspec.Struct, tag="ready"):
    adapters: dict[str, str]
    stats: EngineStats
    pid: int = 0  # the core's process id (front ends that did not start it watch it by this)
    phase: str | None = None  # what it builds in the background while it serves (later changes: Phase)
    dtype: str = ""  # the weights' dtype, the device and the tokens a step holds the core resolved (ModelInfo's)
    device: str = ""
    max_num_tokens: int = 0


class Phase(msgspec.Struct, tag="phase"):
    """What the core is doing while it starts or warms up (runtime/startup.py); None: done."""

    text: str | None


class StartFailed(msgspec.Struct, tag="start_failed"):
    error: str


class StepOutputs(msgspec.Struct, tag="out"):
    deltas: list[tuple[str, list[OutputDelta], bool]]  # (request id, its new deltas, are they its last)
    stats: EngineStats | None
    # one more token of each of these streamed requests, which needs no delta (RequestState.add_plain_token),
    # produced at `time`; they come before the message's deltas (a request's later tokens are among those)
    token_requests: list[str] = []
    token_ids: list[int] = []
    time: float = 0.0


class Rejected(msgspec.Struct, tag="rejected"):
    request_id: str
    error: ErrorInfo


class LoraReply(msgspec.Struct, tag="lora_reply"):
    """Sent to every front end (each keeps the adapter list); the caller's `front_end` completes its call."""

    call_id: int
    adapters: dict[str, str]
    error: ErrorInfo | None = None
    front_end: int = 0


ToCore = Union[AddRequest, Abort, LoraCall, Shutdown, Attach]
ToFrontEnd = Union[Ready, StartFailed, StepOutputs, Rejected, LoraReply, Phase]


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        return msgspec.msgpack.Ext(_NDARRAY, _with_header(a.dtype.str, a.shape, a.tobytes()))
    raise NotImplementedError(f"cannot send a {type(obj).__name__} to the other process")


def _with_header(dtype: str, shape: Any, raw: bytes) -> bytes:
    """[header length: 2 bytes][msgpack (dtype, shape)][raw bytes]."""
    header = msgspec.msgpack.encode((dtype, list(shape)))
    return len(header).to_bytes(2, "little") + header + raw


_header = msgspec.msgpack.Decoder(tuple[str, list[int]])


def _ext_hook(code: int, data: memoryview) -> Any:
    size = int.from_bytes(data[:2], "little")
    dtype, shape = _header.decode(data[2 : 2 + size])
    raw = data[2 + size :]
    if code == _NDARRAY:
        return np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape).copy()
    raise ValueError(f"unknown msgpack extension {code}")


def error_info(exc: BaseException) -> ErrorInfo:
    """`exc` as sent over: its nearest class of runtime.errors (which says the status), message and simple
    attributes. Anything that is no EngineError is an EngineFailedError."""
    name = next((c.__name__ for c in type(exc).__mro__ if getattr(errors, c.__name__, None) is c
                 and issubclass(c, errors.EngineError)), "EngineFailedError")
    message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
    attrs = {k: v for k, v in vars(exc).items() if k != "message" and isinstance(v, (str, int, float, type(None)))}
    return ErrorInfo(name, message, attrs)


def rebuild_error(info: ErrorInfo) -> errors.EngineError:
    """The exception `info` describes, of its original class (EngineFailedError when unknown)."""
    cls = getattr(errors, info.type, errors.EngineFailedError)
    if not (isinstance(cls, type) and issubclass(cls, errors.EngineError)):
        cls = errors.EngineFailedError
    exc = cls.__new__(cls)
    Exception.__init__(exc, info.message)
    exc.message = info.message
    vars(exc).update(info.attrs)
    return exc


encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
to_core = msgspec.msgpack.Decoder(ToCore, ext_hook=_ext_hook)
to_front_end = msgspec.msgpack.Decoder(ToFrontEnd, ext_hook=_ext_hook)
