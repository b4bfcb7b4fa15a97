"""Generate-extension request -> runtime requests (one per prompt of a batch).

Mapping follows what the Triton TensorRT-LLM backend did with the same inputs:
- Neither `top_k` nor `top_p` (or both 0): greedy, as TRT-LLM (temperature has no effect then).
  `top_k` 0 means "all tokens" and `top_p` 0 means "off" once the other one is set.
- No `random_seed`: seed 0, so identical requests sample identical text, as TRT-LLM's fixed default seed.
- `end_id` replaces the model's end token; `end_id` -1 never stops early (TRT-LLM's "no end id").
- `stop_words` are stop strings kept in the output (TRT-LLM returned the stop word's tokens too).
- `embedding_bias_words`/`_weights` add each weight to the logits of every token of its word.
- `exclude_input_in_output` false (default): text_output is the prompt followed by the completion.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from adapters.limits import RequestLimits, check_words, over_limit
from adapters.triton.inputs import ModelKind, read_inputs
from runtime.errors import InvalidRequestError
from runtime.request import GenerationRequest, GuidedDecoding, LoraTask, SamplingOptions
from runtime.tokenizer import Tokenizer

# Model names a Triton client may address. The ensemble and BLS take text; tensorrt_llm takes ids.
TEXT_MODEL_NAMES = ("ensemble", "tensorrt_llm_bls")
IDS_MODEL_NAME = "tensorrt_llm"


def model_kind(name: str, served_model_name: str) -> ModelKind | None:
    """"text" / "ids" for a model name we serve under the Triton dialect; None for unknown names."""
    if name == IDS_MODEL_NAME:
        return "ids"
    if name in TEXT_MODEL_NAMES or name == served_model_name:
        return "text"
    return None


@dataclass
class TritonGenerate:
    """A parsed generate call: one runtime request per prompt, and how to render the answers."""

    model_name: str
    model_version: str
    kind: ModelKind
    requests: list[GenerationRequest]
    prompts: list[Any]  # per batch item: the prompt text (text models) or prompt ids (ids model)
    batched: bool  # the client sent a list of prompts: every response carries batch_index
    stream: bool | None  # the `stream` input as given (None: absent)
    exclude_input_in_output: bool
    return_log_probs: bool
    return_context_logits: bool
    return_generation_logits: bool
    beam_width: int
    num_return_sequences: int
    pad_id: int = 0  # pads output_ids rows of beams of unequal length (ids model)

    @property
    def ensemble_fields(self) -> bool:
        """The ensemble also answers sequence_start/sequence_id/sequence_end (its sequence-batching inputs)."""
        return self.model_name == "ensemble"


def parse_generate(
    body: Any,
    *,
    model_name: str,
    model_version: str,
    kind: ModelKind,
    tokenizer: Tokenizer,
    request_id: str,
    limits: RequestLimits = RequestLimits(),
    exclude_input_default: bool = False,
) -> TritonGenerate:
    """Validate a generate body for model `model_name` and build its runtime requests.

    Raises InvalidRequestError (-> 400) for unknown, missing, malformed or unsupported inputs.
    """
    values = read_inputs(body, kind, model_name)
    _check_limits(values, limits)
    sampling = _sampling(values, tokenizer, kind)
    guided = _guided(values)
    lora_task = _lora_task(values)
    prompts, batched = _prompts(values, kind)
    if len(prompts) > limits.max_prompts:
        raise over_limit("text_input" if kind == "text" else "input_ids", "batch size", len(prompts), limits.max_prompts)
    requests = []
    for i, prompt in enumerate(prompts):
        rid = f"{request_id}-{i}" if batched else request_id
        req = GenerationRequest(
            request_id=rid,
            sampling=_copy_sampling(sampling) if i else sampling,
            num_draft_tokens=_nonneg(values, "num_draft_tokens"),
            use_draft_logits=values.get("use_draft_logits", False),
            guided=guided,
            lora_task=lora_task,
        )
        if kind == "text":
            req.prompt = prompt
        else:
            req.prompt_token_ids = prompt
        requests.append(req)
    return TritonGenerate(
        model_name=model_name,
        model_version=model_version,
        kind=kind,
        requests=requests,
        prompts=prompts,
        batched=batched,
        stream=values.get("stream"),
        exclude_input_in_output=values.get("exclude_input_in_output", exclude_input_default),
        return_log_probs=values.get("return_log_probs", False),
        return_context_logits=values.get("return_context_logits", False),
        return_generation_logits=values.get("return_generation_logits", False),
        beam_width=sampling.beam_width,
        num_return_sequences=sampling.n,
        pad_id=values.get("pad_id", 0),
    )


def _check_limits(values: dict[str, Any], limits: RequestLimits) -> None:
    """400 naming the input when a list input is over the server's limits (each word costs tokenizing)."""
    longest = limits.max_stop_string_length
    check_words("bad_words", values.get("bad_words", []), limits.max_bad_words, longest)
    check_words("stop_words", values.get("stop_words", []), limits.max_stop_strings, longest)
    check_words("embedding_bias_words", values.get("embedding_bias_words", []), limits.max_logit_bias, longest)


def _lora_task(values: dict[str, Any]) -> LoraTask | None:
    """lora_task_id, with lora_weights + lora_config on a task's first request (the engine checks them)."""
    task_id = values.get("lora_task_id")
    if task_id is None:
        if "lora_weights" in values or "lora_config" in values:
            raise InvalidRequestError("lora_weights and lora_config need a lora_task_id", param="lora_task_id")
        return None
    return LoraTask(task_id, values.get("lora_weights"), values.get("lora_config"))


def _prompts(values: dict[str, Any], kind: ModelKind) -> tuple[list[Any], bool]:
    if kind == "text":
        text = values["text_input"]
        return (text, True) if isinstance(text, list) else ([text], False)
    ids = values["input_ids"]
    batched = bool(ids) and isinstance(ids[0], list)
    rows: list[list[int]] = ids if batched else [ids]
    lengths = values.get("input_lengths")
    if lengths is not None:
        lengths = lengths if isinstance(lengths, list) else [lengths]
        if len(lengths) != len(rows):
            raise InvalidRequestError(
                f"input 'input_lengths' has {len(lengths)} values for {len(rows)} rows of 'input_ids'",
                param="input_lengths",
            )
        for row, n in zip(rows, lengths):
            if not 0 < n <= len(row):
                raise InvalidRequestError(
                    f"input 'input_lengths' value {n} is not within 1..{len(row)}, the row's length",
                    param="input_lengths",
                )
        # Rows of a batch are padded to one length; input_lengths says how much is prompt.
        rows = [row[:n] for row, n in zip(rows, lengths)]
    return rows, batched


def _nonneg(values: dict[str, Any], key: str, minimum: int = 0) -> int | None:
    value = values.get(key)
    if value is not None and value < minimum:
        raise InvalidRequestError(f"input '{key}' must be at least {minimum}, got {value}", param=key)
    return value


def _sampling(values: dict[str, Any], tokenizer: Tokenizer, kind: ModelKind) -> SamplingOptions:
    max_name = "max_tokens" if kind == "text" else "request_output_len"
    max_tokens = values["max_tokens"]
    if max_tokens < 1:
        raise InvalidRequestError(f"input '{max_name}' must be at least 1, got {max_tokens}", param=max_name)
    opts = SamplingOptions(max_tokens=max_tokens, seed=values.get("random_seed", 0))
    top_k = _nonneg(values, "top_k") or 0
    top_p = values.get("top_p", 0.0)
    if not 0.0 <= top_p <= 1.0:
        raise InvalidRequestError(f"input 'top_p' must be within [0, 1], got {top_p}", param="top_p")
    if top_k == 0 and top_p == 0.0:
        opts.top_k = 1  # TRT-LLM decodes greedily when neither top-k nor top-p sampling is asked for
    else:
        opts.top_k = top_k
        opts.top_p = top_p if top_p > 0.0 else 1.0
    temperature = values.get("temperature")
    if temperature is not None:
        if temperature < 0.0:
            raise InvalidRequestError(f"input 'temperature' must be >= 0, got {temperature}", param="temperature")
        opts.temperature = temperature
    for key, attr in (
        ("repetition_penalty", "repetition_penalty"),
        ("presence_penalty", "presence_penalty"),
        ("frequency_penalty", "frequency_penalty"),
        ("len_penalty", "length_penalty"),
    ):
        if key in values:
            setattr(opts, attr, values[key])
    opts.min_tokens = _nonneg(values, "min_length") or 0
    opts.beam_width = _nonneg(values, "beam_width", 1) or 1
    opts.n = _nonneg(values, "num_return_sequences", 1) or 1
    end_id = values.get("end_id")
    if end_id is not None:
        if end_id < -1:
            raise InvalidRequestError(f"input 'end_id' must be a token id or -1, got {end_id}", param="end_id")
        opts.ignore_eos = True  # end_id replaces the model's end token(s); -1: none at all
        if end_id >= 0:
            opts.stop_token_ids = [end_id]
    if values.get("return_log_probs"):
        opts.logprobs = 0
    opts.return_context_logits = values.get("return_context_logits", False)
    opts.return_generation_logits = values.get("return_generation_logits", False)
    if kind == "text":
        opts.bad_words = list(values.get("bad_words", []))
        opts.stop = list(values.get("stop_words", []))
        opts.include_stop_str_in_output = True
        opts.logit_bias = _word_bias(values, tokenizer)
    else:
        opts.stop_token_ids += _stop_ids(values.get("stop_words_list"))
        bias = values.get("embedding_bias") or []
        opts.logit_bias = {i: w for i, w in enumerate(bias) if w != 0.0}
    return opts


def _copy_sampling(opts: SamplingOptions) -> SamplingOptions:
    """A batch's requests must not share mutable option lists (the engine may own them)."""
    return copy.deepcopy(opts)


def _word_bias(values: dict[str, Any], tokenizer: Tokenizer) -> dict[int, float]:
    words = values.get("embedding_bias_words", [])
    weights = values.get("embedding_bias_weights", [])
    if len(words) != len(weights):
        raise InvalidRequestError(
            f"inputs 'embedding_bias_words' ({len(words)}) and 'embedding_bias_weights' ({len(weights)}) "
            "must have the same number of elements",
            param="embedding_bias_weights",
        )
    bias: dict[int, float] = {}
    for word, weight in zip(words, weights):
        # Special tokens are not part of the word (the backend's BOS bias was an accident of encode()).
        for token in tokenizer.encode(word, add_special_tokens=False):
            bias[token] = bias.get(token, 0.0) + weight
    return bias


def _stop_ids(word_list: list[list[int]] | None) -> list[int]:
    """TRT-LLM's [2, N] word list ([flat ids], [cumulative end offsets, -1 padded]) -> stop token ids."""
    if not word_list:
        return []
    if len(word_list) != 2:
        raise InvalidRequestError(
            "input 'stop_words_list' must be [[token ids...], [end offsets...]]", param="stop_words_list"
        )
    flat, offsets = word_list
    out: list[int] = []
    start = 0
    for end in offsets:
        if end == -1:
            break
        if not start < end <= len(flat):
            raise InvalidRequestError(f"input 'stop_words_list' has a bad offset {end}", param="stop_words_list")
        if end - start != 1:
            raise InvalidRequestError(
                "input 'stop_words_list': only single-token stop words are supported here; "
                "send text to the ensemble's 'stop_words' for longer ones",
                param="stop_words_list",
            )
        out.append(flat[start])
        start = end
    return out


_GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")


def _guided(values: dict[str, Any]) -> GuidedDecoding | None:
    guide_type = values.get("guided_decoding_guide_type")
    guide = values.get("guided_decoding_guide")
    source = "guided_decoding_guide"  # the input the guide came from, named in errors
    if values.get("guided_decoding") is not None:  # the JSON-schema shorthand
        if guide_type is not None or guide is not None:
            raise InvalidRequestError("give either 'guided_decoding' or 'guided_decoding_guide_type'/"
                                      "'guided_decoding_guide', not both", param="guided_decoding")
        guide_type, guide, source = "json_schema", values["guided_decoding"], "guided_decoding"
    if guide_type is None:
        if guide is not None:
            raise InvalidRequestError(
                "input 'guided_decoding_guide' needs 'guided_decoding_guide_type'", param="guided_decoding_guide"
            )
        return None
    if guide_type not in _GUIDE_TYPES:
        raise InvalidRequestError(
            f"input 'guided_decoding_guide_type' must be one of {', '.join(_GUIDE_TYPES)}, got '{guide_type}'",
            param="guided_decoding_guide_type",
        )
    if guide_type == "json":
        return GuidedDecoding(json_object=True)
    if not guide:
        raise InvalidRequestError(
            f"guided_decoding_guide_type '{guide_type}' needs input 'guided_decoding_guide'",
            param="guided_decoding_guide",
        )
    if guide_type == "json_schema":
        return GuidedDecoding(json_schema=_schema(guide, source), param=source)
    if guide_type == "regex":
        return GuidedDecoding(regex=guide, param=source)
    return GuidedDecoding(grammar=guide, param=source)


def _schema(text: str, source: str) -> dict[str, Any]:
    """The JSON schema object in input `source` (valid JSON that is no object, such as "1", is refused here:
    it is no schema)."""
    try:
        schema = json.loads(text)
    except RecursionError:  # the decoder's stack ran out: far deeper than any schema guided decoding takes
        raise InvalidRequestError(f"input '{source}' is nested too deeply to be a JSON schema", param=source) from None
    except ValueError as exc:
        raise InvalidRequestError(f"input '{source}' is not valid JSON: {exc}", param=source) from None
    if not isinstance(schema, dict):
        raise InvalidRequestError(f"input '{source}' must be a JSON schema object, got JSON {type(schema).__name__}",
                                  param=source)
    return schema
