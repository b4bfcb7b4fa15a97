"""KServe v2 inference over the engine, for both transports: HTTP `infer` and gRPC ModelInfer /
ModelStreamInfer (gateway.triton_grpc).

    answer = await infer_unary(app.state, call)           # one answer: a batch's rows stacked
    async for answer in infer_stream(app.state, call):    # decoupled: one answer per delta (or per prompt)

Requests take the generate path (adapters.triton.parse_generate, GenerationStream, the Triton
metrics' timer), so batching, LoRA, speculation, guided decoding and beams behave as on /generate.
Model names: the served name, `ensemble`, `tensorrt_llm_bls`, `tensorrt_llm`, and a served LoRA
adapter's name (text in, text out, through that adapter); `preprocessing` and `postprocessing` are the tokenizer
alone (adapters.triton.tokenizer_models), answered without the engine's step loop.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.datastructures import State

from adapters.triton import model_kind
from adapters.triton.generate import TritonGenerate
from adapters.triton.infer import (
    check_requested_outputs,
    is_stop_signal,
    parse_infer,
    select_outputs,
    stack_outputs,
)
from adapters.triton.inputs import ModelKind
from adapters.triton.metadata import model_config, model_names
from adapters.triton.outputs import PromptResult, StreamRenderer, complete_outputs
from adapters.triton.tensors import Tensor
from adapters.triton.tokenizer_models import TOKENIZER_MODELS, run_tokenizer_model
from gateway.errors import ModelNotFoundError, ServerDrainingError
from gateway.generation import GenerationStream
from gateway.openai_routes import state_adapters, state_engine
from gateway.triton_metrics import InferenceTimer, metrics_for
from gateway.triton_stops import Caller, stop_signals
from runtime.engine import Engine
from runtime.errors import InvalidRequestError
from runtime.request import GenerationRequest
from runtime.workers import HEAVY_CHARS

MODEL_VERSION = "1"


class UnknownModelError(ModelNotFoundError):
    """A model name or version we do not serve (-> 404), worded as Triton words it."""

    def __init__(self, model: str, version: str | None = None) -> None:
        super().__init__(model)
        which = f"'{model}'" if version is None else f"'{model}' version {version}"
        self.message = f"Request for unknown model: {which} is not found"
        self.args = (self.message,)


@dataclass(frozen=True)
class TritonModel:
    """A model name as addressed, resolved."""

    name: str
    version: str
    kind: ModelKind
    adapter: str | None = None  # the LoRA adapter the name selects


def resolve_model(state: State, name: str, version: str = "") -> TritonModel:
    """The model a Triton client addresses; UnknownModelError (404) for names and versions we do not serve."""
    engine: Engine = state.engine
    kind = name if name in TOKENIZER_MODELS else model_kind(name, engine.model_info.name)
    adapter = None
    if kind is None and name in state_adapters(state, engine):
        kind, adapter = "text", name
    if kind is None:
        raise UnknownModelError(name)
    if version not in ("", MODEL_VERSION):
        raise UnknownModelError(name, version)
    return TritonModel(name, MODEL_VERSION, kind, adapter)


def served_model_names(state: State) -> list[str]:
    """Every model name Triton clients may address (repository index, statistics)."""
    engine: Engine = state.engine
    return model_names(engine.model_info.name, state_adapters(state, engine))


def serving(state: State) -> bool:
    """Readiness as Triton reports it: the engine serves whole (not degraded: a data-parallel core died, as /health
    says), and the server is neither draining nor failed."""
    engine = state.engine
    return bool(engine.ready and engine.degraded is None and not state.drain.draining and not state.fatal_error)


def model_configuration(state: State, model: TritonModel) -> dict[str, Any]:
    """The model's configuration document (HTTP .../config, gRPC ModelConfig)."""
    settings = state.settings
    return model_config(model.name, model.kind, settings.engine,
                        exclude_input_in_output=bool(settings.exclude_input_in_output))


def model_statistics(state: State, name: str = "", version: str = "") -> dict[str, Any]:
    """Triton's statistics document for one model (UnknownModelError: 404), or every model when `name` is empty."""
    if name:
        model = resolve_model(state, name, version)
        models = [(model.name, model.version)]
    else:
        models = [(served, MODEL_VERSION) for served in served_model_names(state)]
    metrics = metrics_for(state.metrics.registry)
    if metrics is None:  # no Triton metrics registered: nothing counted
        return {"model_stats": []}
    return metrics.statistics(models)


def apply_adapter(model: TritonModel, requests: list[GenerationRequest]) -> None:
    """Route the requests through the adapter the model name selects."""
    if model.adapter is None:
        return
    for req in requests:
        if req.lora_task is not None:
            raise InvalidRequestError(f"model '{model.name}' is a LoRA adapter already; lora_task_id cannot be "
                                      "combined with it", param="lora_task_id")
        req.adapter = model.adapter


@dataclass
class InferCall:
    """One infer request, transport-independent."""

    model: str
    version: str
    id: str  # the client's request id: echoed, and what a stop signal names
    tensors: list[Tensor]
    requested: list[str] | None = None  # output names asked for; None: all
    caller: Caller = Caller(b"")  # whose requests its stop signal may end


@dataclass
class InferAnswer:
    """One response: its output tensors, and whether it is the request's last (decoupled streams)."""

    model: str
    version: str
    id: str
    outputs: list[Tensor] = field(default_factory=list)
    final: bool = True


@dataclass
class _Started:
    model: TritonModel
    call: InferCall
    gen: TritonGenerate
    stream: GenerationStream
    timer: InferenceTimer | None

    def answer(self, outputs: list[Tensor], final: bool) -> InferAnswer:
        return InferAnswer(self.model.name, self.model.version, self.call.id, outputs, final)

    async def start(self) -> None:
        """Submit the requests and wait for their first outputs (rejections raise here)."""
        await self.stream.start()
        if self.timer is not None:
            self.timer.first_output()


async def _prepare(state: State, call: InferCall, model: TritonModel, timer: InferenceTimer | None) -> _Started:
    """Parse the call into its requests and their stream (not started yet)."""
    if state.drain.draining:
        raise ServerDrainingError()
    engine = state_engine(state)
    if call.requested is not None:
        check_requested_outputs(call.requested, model.kind, model.name)
    settings = state.settings
    heavy = sum(t.array.size for t in call.tensors) > HEAVY_CHARS
    gen = await state.prepare.call(
        heavy, parse_infer, call.tensors, model_name=model.name, model_version=model.version, kind=model.kind,
        tokenizer=engine.tokenizer, request_id=f"triton-{uuid.uuid4().hex}", limits=state.limits,
        exclude_input_default=bool(settings.exclude_input_in_output))
    apply_adapter(model, gen.requests)
    if timer is not None:
        timer.batch_size = len(gen.requests)
        timer.inputs_done()
    stream = GenerationStream(engine, gen.requests, state.metrics, timeout=settings.request_timeout)
    return _Started(model, call, gen, stream, timer)


def inference_timer(state: State, model: TritonModel) -> InferenceTimer | None:
    """The nv_inference_* timer of one request (None when no Triton metrics are registered)."""
    metrics = metrics_for(state.metrics.registry)
    return metrics.track(model.name, model.version) if metrics is not None else None


def _stop(state: State, call: InferCall, model: TritonModel) -> InferAnswer:
    """Answer a stop signal: the caller's requests of that id end early; this answer has no outputs."""
    stop_signals(state).stop(call.caller, model.name, call.id)
    return InferAnswer(model.name, model.version, call.id)


async def _tokenizer_answer(state: State, call: InferCall, model: TritonModel) -> InferAnswer:
    """The answer of the preprocessing or postprocessing model: the tokenizer's work, in a worker thread when
    large, timed in the Triton metrics as any model."""
    if state.drain.draining:
        raise ServerDrainingError()
    engine = state_engine(state)
    if call.requested is not None:
        check_requested_outputs(call.requested, model.kind, model.name)
    timer = inference_timer(state, model)
    ok = False
    try:
        heavy = sum(t.array.size for t in call.tensors) > HEAVY_CHARS
        outputs = await state.prepare.call(heavy, run_tokenizer_model, model.kind, call.tensors, engine.tokenizer)
        if call.requested is not None:
            outputs = [t for name in call.requested for t in outputs if t.name == name]
        ok = True
        return InferAnswer(model.name, model.version, call.id, outputs)
    finally:
        if timer is not None:
            timer.finish(ok)


async def infer_unary(state: State, call: InferCall) -> InferAnswer:
    """The complete answer of an infer request (a batch: its rows stacked on the batch dimension)."""
    model = resolve_model(state, call.model, call.version)
    if model.kind in TOKENIZER_MODELS:
        return await _tokenizer_answer(state, call, model)
    if is_stop_signal(call.tensors):
        return _stop(state, call, model)
    timer = inference_timer(state, model)
    ok = False
    try:
        started = await _prepare(state, call, model, timer)
        with stop_signals(state).running(call.caller, model.name, call.id, started.stream):
            try:
                await started.start()
                rows = await _complete(started)
            finally:
                started.stream.close()
        if timer is not None:
            timer.outputs_done()
        ok = True
        return started.answer(stack_outputs(rows), final=True)
    finally:
        if timer is not None:
            timer.finish(ok)


async def infer_stream(state: State, call: InferCall) -> AsyncIterator[InferAnswer]:
    """A decoupled request's answers: one per delta with `stream` true, else one complete answer per prompt
    (and sample), as the backend's decoupled mode. The last one is `final`."""
    model = resolve_model(state, call.model, call.version)
    if model.kind in TOKENIZER_MODELS:
        yield await _tokenizer_answer(state, call, model)
        return
    if is_stop_signal(call.tensors):
        yield _stop(state, call, model)
        return
    timer = inference_timer(state, model)
    ok = False
    try:
        started = await _prepare(state, call, model, timer)
        gen = started.gen
        with stop_signals(state).running(call.caller, model.name, call.id, started.stream):
            try:
                await started.start()
                if gen.stream:
                    async for answer in _deltas(started):
                        yield answer
                else:
                    rows = await _complete(started)
                    for i, outputs in enumerate(rows):
                        yield started.answer(outputs, final=i == len(rows) - 1)
            finally:
                started.stream.close()
        ok = True
    finally:
        if timer is not None:
            timer.outputs_done()
            timer.finish(ok)


async def _complete(started: _Started) -> list[list[Tensor]]:
    """Every prompt's (and sample's) complete answer, as its selected output tensors."""
    gen = started.gen
    results = [PromptResult() for _ in gen.requests]
    async for b, delta in started.stream:
        results[b].add(delta)
    return [select_outputs(gen, outputs, started.call.requested) for outputs in complete_outputs(gen, results)]


async def _deltas(started: _Started) -> AsyncIterator[InferAnswer]:
    """One answer per delta; the one that finishes the last sequence is final (an empty final answer
    closes the request if the engine ended it without such a delta)."""
    gen = started.gen
    renderer = StreamRenderer(gen)
    expected = len(gen.requests) * max(gen.num_return_sequences, gen.beam_width)
    finished: set[tuple[int, int]] = set()
    async for b, delta in started.stream:
        if delta.finish_reason is not None:
            finished.add((b, delta.index))
        final = len(finished) >= expected
        yield started.answer(select_outputs(gen, renderer.outputs((b, delta)), started.call.requested), final)
        if final:
            return
    yield started.answer([], final=True)
