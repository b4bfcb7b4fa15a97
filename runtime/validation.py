"""Request validation for the native runtime: every check that can reject a request before it queues.

Each failure is a typed error (runtime.errors) naming the offending field in `param`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from runtime.config import EngineConfig
from runtime.errors import (
    InvalidRequestError,
    PromptTooLongError,
    UnsupportedOptionError,
)
from runtime.guided_limits import check_limits
from runtime.request import GenerationRequest, SamplingOptions
from runtime.tokenizer import Tokenizer

MAX_LOGPROBS = 20  # top alternatives per token (OpenAI's limit)


@dataclass
class PreparedRequest:
    """What validation computed: the prompt's ids, the resolved max_tokens, banned token sequences."""

    prompt_token_ids: list[int]
    max_tokens: int
    bad_words_ids: list[list[int]]


def validate_request(
    request: GenerationRequest,
    *,
    tokenizer: Tokenizer,
    vocab_size: int,
    context_window: int,
    config: EngineConfig,
    max_num_tokens: int,
) -> PreparedRequest:
    """Check `request` against the model and engine limits (`max_num_tokens`: the tokens a step holds, as the engine
    resolved them); tokenise its prompt."""
    _check_request(request, vocab_size, config)
    if request.prompt_token_ids is not None:
        ids = list(request.prompt_token_ids)
        _check_prompt_ids(ids, vocab_size)
    elif request.prompt:
        tokenizer.check_fits(request.prompt, context_window)
        ids = tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens)
    else:
        ids = []
    if not ids:
        raise InvalidRequestError("The prompt is empty", param="prompt")
    opts = request.sampling
    max_tokens = opts.output_limit(context_window - len(ids), config.default_max_tokens)
    _check_lengths(len(ids), max_tokens, opts, context_window, config.enable_chunked_prefill, max_num_tokens)
    bad_words = tokenizer.bad_words_ids(opts.bad_words) if opts.bad_words else []
    if request.guided is not None:  # refused here, without xgrammar, before a costly constraint reaches the core
        check_limits(request.guided)
    return PreparedRequest(prompt_token_ids=ids, max_tokens=max_tokens, bad_words_ids=bad_words)


def check_prepared(
    request: GenerationRequest,
    prepared: PreparedRequest,
    *,
    vocab_size: int,
    context_window: int,
    config: EngineConfig,
    max_num_tokens: int,
) -> None:
    """validate_request's checks of a request already prepared elsewhere: the engine core checks again what a
    front end sends it (a message is decoded, not trusted), so that no request can break the step loop."""
    _check_request(request, vocab_size, config)
    ids = prepared.prompt_token_ids
    if not ids:
        raise InvalidRequestError("The prompt is empty", param="prompt")
    _check_prompt_ids(ids, vocab_size)
    if prepared.max_tokens < 1:
        raise InvalidRequestError("max_tokens must be at least 1", param="max_tokens")
    _check_lengths(len(ids), prepared.max_tokens, request.sampling, context_window, config.enable_chunked_prefill,
                   max_num_tokens)
    for words in prepared.bad_words_ids:
        if not words or not all(0 <= t < vocab_size for t in words):
            raise InvalidRequestError("bad_words holds an empty sequence or an id outside the vocabulary",
                                      param="bad_words")


def _check_request(request: GenerationRequest, vocab_size: int, config: EngineConfig) -> None:
    opts = request.sampling
    if not request.request_id:
        raise InvalidRequestError("request_id must be a non-empty string", param="request_id")
    _check_options(opts, vocab_size, config)
    # LoRA adapters (request.adapter / request.lora_task) are resolved by the engine's LoraManager.
    if request.guided is not None and opts.beam_width > 1:  # the grammar itself is compiled by the engine core
        raise UnsupportedOptionError("guided", "native", "guided decoding cannot be combined with beam search")
    if request.num_draft_tokens is not None and request.num_draft_tokens < 0:
        raise InvalidRequestError("num_draft_tokens must be >= 0", param="num_draft_tokens")


def _check_prompt_ids(ids: list[int], vocab_size: int) -> None:
    bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequestError(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab_size})",
                                  param="prompt")


def _check_lengths(prompt_len: int, max_tokens: int, opts: SamplingOptions, context_window: int,
                   chunked_prefill: bool, max_num_tokens: int) -> None:
    if prompt_len + max(max_tokens, 1) > context_window:
        raise PromptTooLongError(prompt_len, max(max_tokens, 1), context_window)
    if opts.min_tokens > max_tokens:
        raise InvalidRequestError(
            f"min_tokens ({opts.min_tokens}) must be <= max_tokens ({max_tokens})", param="min_tokens"
        )
    if not chunked_prefill and prompt_len > max_num_tokens:
        raise InvalidRequestError(
            f"The prompt has {prompt_len} tokens, more than max_num_tokens ({max_num_tokens}), "
            "and chunked prefill is disabled",
            param="prompt",
        )


def _check_options(opts: SamplingOptions, vocab_size: int, config: EngineConfig) -> None:
    def require(ok: bool, param: str, message: str) -> None:
        if not ok:
            raise InvalidRequestError(message, param=param)

    def finite(value: float) -> bool:
        return isinstance(value, (int, float)) and math.isfinite(value)

    require(opts.max_tokens is None or opts.max_tokens >= 1, "max_tokens", "max_tokens must be at least 1")
    require(finite(opts.temperature) and opts.temperature >= 0, "temperature", "temperature must be >= 0")
    require(finite(opts.top_p) and 0 < opts.top_p <= 1, "top_p", "top_p must be in (0, 1]")
    require(opts.top_k >= -1, "top_k", "top_k must be >= 0 (0 or -1: no limit)")
    require(finite(opts.min_p) and 0 <= opts.min_p <= 1, "min_p", "min_p must be in [0, 1]")
    require(
        finite(opts.repetition_penalty) and opts.repetition_penalty > 0,
        "repetition_penalty",
        "repetition_penalty must be > 0",
    )
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(opts, name)
        require(finite(value) and -2 <= value <= 2, name, f"{name} must be in [-2, 2]")
    require(opts.min_tokens >= 0, "min_tokens", "min_tokens must be >= 0")
    require(
        1 <= opts.n <= config.max_batch_size, "n", f"n must be between 1 and max_batch_size ({config.max_batch_size})"
    )
    require(opts.beam_width >= 1, "beam_width", "beam_width must be >= 1")
    if opts.beam_width > config.max_beam_width:
        raise InvalidRequestError(
            f"beam_width {opts.beam_width} exceeds max_beam_width ({config.max_beam_width})", param="beam_width"
        )
    if opts.beam_width > 1:
        check_beam_options(opts)
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(opts, name)
        require(
            value is None or 0 <= value <= MAX_LOGPROBS, name, f"{name} must be between 0 and {MAX_LOGPROBS}"
        )
    for token_id in opts.stop_token_ids:
        require(0 <= token_id < vocab_size, "stop_token_ids", f"stop token id {token_id} is outside the vocabulary")
    for token_id, bias in opts.logit_bias.items():
        require(0 <= int(token_id) < vocab_size, "logit_bias", f"logit_bias token id {token_id} is outside the vocabulary")
        require(finite(bias) and -100 <= bias <= 100, "logit_bias", "logit_bias values must be in [-100, 100]")
    require(all(isinstance(s, str) for s in opts.stop), "stop", "stop must be a list of strings")


def check_beam_options(opts: SamplingOptions) -> None:
    """Reject options that beam search (runtime/native/beam_search.py) cannot honour (named in the error). Call when
    beam_width > 1."""
    if opts.n != 1:
        raise InvalidRequestError(
            f"n must be 1 with beam search (beam_width {opts.beam_width} returns {opts.beam_width} beams)", param="n"
        )
    if not (isinstance(opts.length_penalty, (int, float)) and math.isfinite(opts.length_penalty)):
        raise InvalidRequestError("length_penalty must be a finite number", param="length_penalty")
    unsupported = {
        "stop": bool(opts.stop),
        "repetition_penalty": opts.repetition_penalty != 1.0,
        "presence_penalty": opts.presence_penalty != 0.0,
        "frequency_penalty": opts.frequency_penalty != 0.0,
        "logit_bias": bool(opts.logit_bias),
        "bad_words": bool(opts.bad_words),
        "return_generation_logits": opts.return_generation_logits,
    }
    for option, used in unsupported.items():
        if used:
            raise UnsupportedOptionError(option, "native", "not available with beam search (beam_width > 1)")
