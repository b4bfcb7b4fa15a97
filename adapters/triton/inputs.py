"""The inputs of the Triton models we serve, and reading them from a generate-extension body.

One table per model kind is the single source for request parsing and for KServe metadata
(`GET /v2/models/{m}`, `/config`). A body's inputs sit at top level or inside `parameters`; a value
is a JSON scalar or, as Triton accepts for a [1]-shaped tensor, a one-element list. Names the
backend's `ensemble`/`tensorrt_llm_bls` and `tensorrt_llm` models used in some release are accepted
as aliases (e.g. `seed` for `random_seed`, `runtime_top_k` for `top_k`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from runtime.errors import InvalidRequestError

Kind = Literal["text", "ids", "lengths", "str", "int", "uint64", "float", "bool", "words", "floats", "ints2d", "floats2d"]
# "preprocessing" / "postprocessing": the backend's tokenizer models (adapters/triton/tokenizer_models.py),
# served over infer only; the generate path takes "text" and "ids"
ModelKind = Literal["text", "ids", "preprocessing", "postprocessing"]

_UINT64_MAX = 2**64 - 1
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class InputSpec:
    """One model input: wire name, value kind, KServe datatype and dims (without the batch dim)."""

    name: str
    kind: Kind
    datatype: str  # KServe: BYTES | INT32 | UINT64 | FP32 | BOOL | FP16
    dims: tuple[int, ...] = (1,)
    required: bool = False
    aliases: tuple[str, ...] = ()
    supported: bool = True  # False: accepted name; a non-neutral value is a 400 "not supported yet"
    key: str = ""  # internal name shared by both models' tables; "" = name

    @property
    def field(self) -> str:
        return self.key or self.name


def _s(name: str, kind: Kind, datatype: str, dims: tuple[int, ...] = (1,), **kw: Any) -> InputSpec:
    return InputSpec(name, kind, datatype, dims, **kw)


# Sampling and output inputs shared by the text models and the ids model (BLS names; ensemble and
# newer releases' names are aliases).
_COMMON: tuple[InputSpec, ...] = (
    _s("end_id", "int", "INT32"),
    _s("pad_id", "int", "INT32"),
    _s("temperature", "float", "FP32"),
    _s("len_penalty", "float", "FP32", aliases=("length_penalty",)),
    _s("repetition_penalty", "float", "FP32"),
    _s("min_length", "int", "INT32", aliases=("min_tokens",)),
    _s("presence_penalty", "float", "FP32"),
    _s("frequency_penalty", "float", "FP32"),
    _s("random_seed", "uint64", "UINT64", aliases=("seed",)),
    _s("return_log_probs", "bool", "BOOL"),
    _s("return_context_logits", "bool", "BOOL"),
    _s("return_generation_logits", "bool", "BOOL"),
    _s("beam_width", "int", "INT32"),
    _s("num_return_sequences", "int", "INT32"),
    _s("exclude_input_in_output", "bool", "BOOL"),
    _s("num_draft_tokens", "int", "INT32"),
    _s("use_draft_logits", "bool", "BOOL"),
    _s("guided_decoding_guide_type", "str", "BYTES"),
    _s("guided_decoding_guide", "str", "BYTES"),
    _s("guided_decoding", "str", "BYTES"),  # a JSON schema: shorthand for guide_type json_schema + guide
    # LoRA (TensorRT-LLM's format; runtime/native/lora/trtllm_format.py): a task's first request brings weights
    _s("lora_task_id", "uint64", "UINT64"),
    _s("lora_weights", "floats2d", "FP16", (-1, -1)),
    _s("lora_config", "ints2d", "INT32", (-1, 3)),
    _s("prompt_embedding_table", "floats2d", "FP16", (-1, -1), supported=False),
    _s("prompt_vocab_size", "int", "INT32", supported=False),
    _s("return_perf_metrics", "bool", "BOOL", supported=False),
)

TEXT_MODEL_INPUTS: tuple[InputSpec, ...] = (
    _s("text_input", "text", "BYTES", required=True),
    _s("max_tokens", "int", "INT32", required=True),
    _s("bad_words", "words", "BYTES", (-1,)),
    _s("stop_words", "words", "BYTES", (-1,)),
    _s("top_k", "int", "INT32", aliases=("runtime_top_k",)),
    _s("top_p", "float", "FP32", aliases=("runtime_top_p",)),
    _s("stream", "bool", "BOOL", aliases=("streaming",)),
    _s("embedding_bias_words", "words", "BYTES", (-1,)),
    _s("embedding_bias_weights", "floats", "FP32", (-1,)),
    *_COMMON,
    _s("decoder_text_input", "str", "BYTES", supported=False),
    _s("image_input", "floats2d", "FP16", (-1, 3, -1, -1), supported=False),
    _s("image_url_input", "str", "BYTES", supported=False),
)

IDS_MODEL_INPUTS: tuple[InputSpec, ...] = (
    _s("input_ids", "ids", "INT32", (-1,), required=True),
    _s("input_lengths", "lengths", "INT32", required=True),
    _s("request_output_len", "int", "INT32", required=True, key="max_tokens"),
    _s("runtime_top_k", "int", "INT32", aliases=("top_k",), key="top_k"),
    _s("runtime_top_p", "float", "FP32", aliases=("top_p",), key="top_p"),
    _s("streaming", "bool", "BOOL", aliases=("stream",), key="stream"),
    _s("stop_words_list", "ints2d", "INT32", (2, -1)),
    _s("bad_words_list", "ints2d", "INT32", (2, -1), supported=False),
    _s("embedding_bias", "floats", "FP32", (-1,)),
    *_COMMON,
    # encoder-decoder models' decoder start; the backend ignores it for decoder-only models, as we do (its
    # end_to_end_test.py sends the preprocessing model's DECODER_INPUT_ID)
    _s("decoder_input_ids", "ids", "INT32", (-1,)),
    _s("draft_input_ids", "ids", "INT32", (-1,), supported=False),
    _s("stop", "bool", "BOOL", supported=False),
)

# Outputs per model kind: (name, datatype, dims) as the backend's config.pbtxt declares them.
OutputSpec = tuple[str, str, tuple[int, ...]]
_COMMON_OUTPUTS: tuple[OutputSpec, ...] = (
    ("cum_log_probs", "FP32", (-1,)),
    ("output_log_probs", "FP32", (-1, -1)),
    ("context_logits", "FP32", (-1, -1)),
    ("generation_logits", "FP32", (-1, -1, -1)),
    ("batch_index", "INT32", (1,)),
    ("sequence_index", "INT32", (1,)),
)
TEXT_MODEL_OUTPUTS: tuple[OutputSpec, ...] = (("text_output", "BYTES", (-1,)), *_COMMON_OUTPUTS)
IDS_MODEL_OUTPUTS: tuple[OutputSpec, ...] = (
    ("output_ids", "INT32", (-1, -1)),
    ("sequence_length", "INT32", (-1,)),
    *_COMMON_OUTPUTS,
)

# The backend's preprocessing and postprocessing models (all_models/inflight_batcher_llm/*/config.pbtxt, v0.19.0);
# their multimodal tensors are accepted names only.
PREPROCESSING_INPUTS: tuple[InputSpec, ...] = (
    _s("QUERY", "str", "BYTES", required=True),
    _s("REQUEST_OUTPUT_LEN", "int", "INT32", required=True),
    _s("BAD_WORDS_DICT", "words", "BYTES", (-1,)),
    _s("STOP_WORDS_DICT", "words", "BYTES", (-1,)),
    _s("EMBEDDING_BIAS_WORDS", "words", "BYTES", (-1,)),
    _s("EMBEDDING_BIAS_WEIGHTS", "floats", "FP32", (-1,)),
    _s("END_ID", "int", "INT32"),
    _s("PAD_ID", "int", "INT32"),
    _s("DECODER_QUERY", "str", "BYTES", supported=False),
    _s("IMAGE_BYTES", "ints2d", "UINT8", (-1, -1, -1, -1), supported=False),
    _s("IMAGE_URL", "str", "BYTES", supported=False),
    _s("VIDEO_BYTES", "ints2d", "UINT8", (-1, -1, -1, -1), supported=False),
    _s("PROMPT_TABLE_EXTRA_ID", "uint64", "UINT64", supported=False),
)
PREPROCESSING_OUTPUTS: tuple[OutputSpec, ...] = (
    ("INPUT_ID", "INT32", (-1,)),
    ("REQUEST_INPUT_LEN", "INT32", (1,)),
    ("DECODER_INPUT_ID", "INT32", (-1,)),
    ("REQUEST_DECODER_INPUT_LEN", "INT32", (1,)),
    ("BAD_WORDS_IDS", "INT32", (2, -1)),
    ("STOP_WORDS_IDS", "INT32", (2, -1)),
    ("EMBEDDING_BIAS", "FP32", (-1,)),
    ("REQUEST_OUTPUT_LEN", "INT32", (-1,)),
    ("OUT_END_ID", "INT32", (1,)),
    ("OUT_PAD_ID", "INT32", (1,)),
)
POSTPROCESSING_INPUTS: tuple[InputSpec, ...] = (
    _s("TOKENS_BATCH", "ints2d", "INT32", (-1, -1), required=True),
    _s("SEQUENCE_LENGTH", "ints2d", "INT32", (-1,), required=True),
)
POSTPROCESSING_OUTPUTS: tuple[OutputSpec, ...] = (("OUTPUT", "BYTES", (-1,)),)

_INPUTS: dict[ModelKind, tuple[InputSpec, ...]] = {
    "text": TEXT_MODEL_INPUTS, "ids": IDS_MODEL_INPUTS, "preprocessing": PREPROCESSING_INPUTS,
    "postprocessing": POSTPROCESSING_INPUTS}
_OUTPUTS: dict[ModelKind, tuple[OutputSpec, ...]] = {
    "text": TEXT_MODEL_OUTPUTS, "ids": IDS_MODEL_OUTPUTS, "preprocessing": PREPROCESSING_OUTPUTS,
    "postprocessing": POSTPROCESSING_OUTPUTS}

# Top-level body members that are not model inputs.
_ENVELOPE = {"parameters", "id"}


def input_specs(kind: ModelKind) -> tuple[InputSpec, ...]:
    """The input table of a model kind."""
    return _INPUTS[kind]


def output_specs(kind: ModelKind) -> tuple[OutputSpec, ...]:
    """The output table of a model kind."""
    return _OUTPUTS[kind]


def _index(specs: Iterable[InputSpec]) -> dict[str, InputSpec]:
    out: dict[str, InputSpec] = {}
    for spec in specs:
        for name in (spec.name, *spec.aliases):
            out[name] = spec
    return out


_INDEX: dict[ModelKind, dict[str, InputSpec]] = {kind: _index(specs) for kind, specs in _INPUTS.items()}


def read_inputs(body: Any, kind: ModelKind, model_name: str) -> dict[str, Any]:
    """Validate a generate body; return {internal field name: coerced value} for the inputs given.

    Raises InvalidRequestError (-> 400) naming unknown inputs, missing required ones, inputs given
    twice (top level and `parameters`, or under two aliases), values of the wrong type, and inputs
    we accept by name but do not support yet when they carry a non-neutral value.
    """
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    params = body.get("parameters", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise InvalidRequestError("'parameters' must be a JSON object", param="parameters")
    index = _INDEX[kind]
    raw = [(k, v) for k, v in body.items() if k not in _ENVELOPE] + list(params.items())
    unknown = sorted({k for k, _ in raw if k not in index})
    if unknown:
        names = ", ".join(f"'{u}'" for u in unknown)
        raise InvalidRequestError(
            f"unexpected inference input{'s' if len(unknown) > 1 else ''} {names} for model '{model_name}'",
            param=unknown[0],
        )
    values: dict[str, Any] = {}
    given_as: dict[str, str] = {}
    for name, value in raw:
        spec = index[name]
        if spec.field in values:
            raise InvalidRequestError(
                f"input '{spec.name}' is given twice (as '{given_as[spec.field]}' and '{name}')", param=name
            )
        coerced = coerce(spec, name, value)
        if not spec.supported and not _neutral(coerced):
            raise InvalidRequestError(f"input '{name}' is not supported yet", param=name)
        values[spec.field] = coerced
        given_as[spec.field] = name
    missing = [s.name for s in index.values() if s.required and s.field not in values]
    if missing:
        missing = sorted(set(missing))
        raise InvalidRequestError(
            f"missing required input{'s' if len(missing) > 1 else ''} "
            f"{', '.join(repr(m) for m in missing)} for model '{model_name}'",
            param=missing[0],
        )
    return values


def _neutral(value: Any) -> bool:
    return value is None or value is False or value == 0 or value == "" or value == []


def _type_error(name: str, expected: str, value: Any) -> InvalidRequestError:
    return InvalidRequestError(f"input '{name}' must be {expected}, got {_json_type(value)}", param=name)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return f"a list of {len(value)} elements"
    return "an object"


def _unwrap(name: str, value: Any) -> Any:
    """A [1]-shaped tensor: a scalar, or a list holding exactly one element (nested lists too)."""
    while isinstance(value, list):
        if len(value) != 1:
            raise InvalidRequestError(f"input '{name}' takes one value, got {len(value)}", param=name)
        value = value[0]
    return value


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    """A JSON number a float can hold (an integer literal of 400 digits cannot: float() overflows)."""
    if isinstance(v, float):
        return True
    return _is_int(v) and -sys.float_info.max <= v <= sys.float_info.max


def coerce(spec: InputSpec, name: str, value: Any) -> Any:
    """Check one input's JSON value against its kind; return the Python value."""
    kind = spec.kind
    if kind == "text":  # one prompt, or a batch of prompts
        if isinstance(value, list) and len(value) != 1:
            if not value or not all(isinstance(v, str) for v in value):
                raise _type_error(name, "a string or a non-empty list of strings", value)
            return list(value)
        value = _unwrap(name, value)
        if not isinstance(value, str):
            raise _type_error(name, "a string", value)
        return value
    if kind == "ids":  # one prompt's ids ([..] or [[..]]), or a batch ([[..], [..], ..])
        if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
            if len(value) == 1:
                return _int_list(name, value[0])
            return [_int_list(name, row) for row in value]
        return _int_list(name, value)
    if kind == "lengths":  # one length, or one per batch row
        if isinstance(value, list) and len(value) != 1:
            if not value or not all(_is_int(v) and v >= 0 for v in value):
                raise _type_error(name, "a length or a list of lengths", value)
            return list(value)
        value = _unwrap(name, value)
        if not _is_int(value) or value < 0:
            raise _type_error(name, "a non-negative integer", value)
        return value
    if kind == "words":
        if isinstance(value, str):
            return [value] if value else []
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return [v for v in value if v]  # an empty string means "no word", as the backend
        raise _type_error(name, "a string or a list of strings", value)
    if kind == "floats":
        if _is_number(value):
            return [float(value)]
        if isinstance(value, list) and all(_is_number(v) for v in value):
            return [float(v) for v in value]
        raise _type_error(name, "a list of numbers", value)
    if kind in ("ints2d", "floats2d"):
        check = _is_int if kind == "ints2d" else _is_number
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], list) and value[0] \
                and all(isinstance(r, list) for r in value[0]):
            value = value[0]  # a leading batch dimension of 1
        if isinstance(value, list) and all(isinstance(r, list) and all(check(v) for v in r) for r in value):
            return value
        raise _type_error(name, "a list of lists of " + ("integers" if kind == "ints2d" else "numbers"), value)
    value = _unwrap(name, value)
    if kind == "str":
        if not isinstance(value, str):
            raise _type_error(name, "a string", value)
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise _type_error(name, "a boolean", value)
        return value
    if kind == "float":
        if not _is_number(value):
            raise _type_error(name, "a number", value)
        return float(value)
    if kind == "int":
        if not _is_int(value) or not -_INT32_MAX - 1 <= value <= _INT32_MAX:
            raise _type_error(name, "a 32-bit integer", value)
        return value
    if kind == "uint64":
        if not _is_int(value) or not 0 <= value <= _UINT64_MAX:
            raise _type_error(name, "an unsigned 64-bit integer", value)
        return value
    raise AssertionError(kind)


def _int_list(name: str, value: Any) -> list[int]:
    if isinstance(value, list) and value and all(_is_int(v) for v in value):
        return list(value)
    raise _type_error(name, "a non-empty list of token ids", value)


def specs_by_name(kind: ModelKind) -> Mapping[str, InputSpec]:
    """{input name or alias: spec} of a model kind."""
    return _INDEX[kind]


def specs_by_field(kind: ModelKind) -> Mapping[str, InputSpec]:
    """{internal field name: spec} of a model kind (for messages naming the public input)."""
    return {s.field: s for s in input_specs(kind)}
