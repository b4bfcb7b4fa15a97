"""GenerationRequest -> TensorRT-LLM SamplingParams (field names: NVIDIA/TensorRT-LLM
tensorrt_llm/sampling_params.py @ a98a9061d72f6fd39f5d055ebdd2c6878a100e2c), and the options this
backend rejects with UnsupportedOptionError.

Stop strings are not handed to TensorRT-LLM: its runtime matches them as token sequences of one
tokenisation, so text produced through other tokens would not stop. The backend matches them on the
detokenised text instead (runtime.stop.StopStringMatcher, as the native engine) and aborts the TRT-LLM
request on a match. For the same reason `detokenize=False`: text comes from runtime.detokenizer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runtime.errors import (
    InvalidRequestError,
    PromptTooLongError,
    UnsupportedOptionError,
)
from runtime.request import GenerationRequest
from runtime.trtllm.api import TrtllmApi

BACKEND = "trtllm"


@dataclass(frozen=True)
class SamplingContext:
    """Engine facts the mapping needs."""

    context_window: int
    vocab_size: int  # logits width, for embedding_bias
    eos_token_ids: tuple[int, ...]
    default_seed: int  # EngineConfig.seed, used when the request gives none
    default_max_tokens: int | None  # EngineConfig.default_max_tokens, used when the request gives none
    max_beam_width: int
    speculative: bool  # a speculative decoding config is active
    num_draft_tokens: int = 0  # its draft length (fixed when the LLM is built)
    context_logits: bool = True  # the model folder returns context logits (ModelFolder.context_logits)


def check_supported(request: GenerationRequest, ctx: SamplingContext) -> None:
    """Raise UnsupportedOptionError for options TensorRT-LLM's LLM API cannot honour per request."""
    if request.num_draft_tokens is not None and request.num_draft_tokens != ctx.num_draft_tokens:
        # Asking for what the engine does anyway is harmless; anything else cannot be honoured.
        raise UnsupportedOptionError("num_draft_tokens", BACKEND,
                                     f"the draft length is fixed when the engine starts "
                                     f"(--num-draft-tokens; this engine: {ctx.num_draft_tokens})")
    if request.use_draft_logits:
        raise UnsupportedOptionError("use_draft_logits", BACKEND)
    s = request.sampling
    if ctx.speculative and (s.return_context_logits or s.return_generation_logits):
        name = "return_context_logits" if s.return_context_logits else "return_generation_logits"
        raise UnsupportedOptionError(name, BACKEND, "not available with speculative decoding")
    if s.beam_width > 1 and (s.logprobs is not None or s.prompt_logprobs is not None):
        raise UnsupportedOptionError("logprobs", BACKEND, "not returned for beam search")
    if not ctx.context_logits and (s.prompt_logprobs is not None or s.return_context_logits):
        name = "prompt_logprobs" if s.prompt_logprobs is not None else "return_context_logits"
        raise UnsupportedOptionError(name, BACKEND, "this TensorRT engine was built without context logits "
                                     "(rebuild it with `trtllm-build --gather_context_logits`)")
    if request.guided is not None:
        check_guided_can_end(request, ctx)


def check_guided_can_end(request: GenerationRequest, ctx: SamplingContext) -> None:
    """Refuse options that keep a guided answer going past its grammar's end.

    TensorRT-LLM's grammars end with the tokenizer's eos token (its guided decoding config's stop tokens;
    tests/fakes/tensorrt_llm/llmapi/llm.py) and stop masking there, so generation would go on unconstrained
    (the native runtime ends the sample there instead): with ignore_eos that token no longer stops, unless
    it is also a stop token (Triton's end_id set to it), and min_tokens bans it while the grammar allows
    nothing else.
    """
    s, guided = request.sampling, f"guided decoding ('{request.guided.param}')"  # type: ignore[union-attr]
    if s.ignore_eos and not set(ctx.eos_token_ids[:1]) <= set(s.stop_token_ids):
        raise UnsupportedOptionError("ignore_eos", BACKEND, f"{guided} could not end the answer at the grammar's end "
                                     "(Triton: an end_id other than the model's end token)")
    if s.min_tokens:
        raise UnsupportedOptionError("min_tokens", BACKEND, f"{guided} could not end the answer at the grammar's end "
                                     "(Triton: min_length)")


def bad_word_strings(words: list[str]) -> list[str]:
    """Each bad word as written and with one leading space, as the native engine bans them
    (runtime.tokenizer.Tokenizer.bad_words_ids); TRT-LLM tokenises each string into a banned sequence."""
    out: list[str] = []
    for word in words:
        for variant in (word, " " + word.lstrip()):
            if variant.strip() and variant not in out:
                out.append(variant)
    return out


def sampling_kwargs(request: GenerationRequest, prompt_len: int, ctx: SamplingContext) -> dict[str, Any]:
    """The SamplingParams keyword arguments for `request` (values only; no tensorrt_llm needed)."""
    s = request.sampling
    check_supported(request, ctx)
    max_tokens = s.output_limit(ctx.context_window - prompt_len, ctx.default_max_tokens)
    if max_tokens < 1 or prompt_len + max_tokens > ctx.context_window:
        raise PromptTooLongError(prompt_len, max(max_tokens, 1), ctx.context_window)
    # No end_id: TensorRT-LLM then takes the tokenizer's eos id (our eos_token_ids[0], from the same
    # tokenizer) and only then tokenizes the bad words (LLM._prepare_sampling_params calls
    # SamplingParams._setup only when end_id is None; the worker refuses untokenized bad words).
    kw: dict[str, Any] = dict(
        max_tokens=max_tokens,
        # Always explicit: TRT-LLM samples greedily when no sampling knob is given at all.
        temperature=s.temperature,
        seed=ctx.default_seed if s.seed is None else s.seed,
        ignore_eos=s.ignore_eos,
        skip_special_tokens=s.skip_special_tokens,
        detokenize=False,
        add_special_tokens=request.add_special_tokens,
        exclude_input_from_output=True,
        include_stop_str_in_output=s.include_stop_str_in_output,
    )
    if s.top_k:
        kw["top_k"] = s.top_k
    if s.top_p < 1.0:
        kw["top_p"] = s.top_p
    if s.min_p > 0.0:
        kw["min_p"] = s.min_p
    if s.repetition_penalty != 1.0:
        kw["repetition_penalty"] = s.repetition_penalty
    if s.presence_penalty:
        kw["presence_penalty"] = s.presence_penalty
    if s.frequency_penalty:
        kw["frequency_penalty"] = s.frequency_penalty
    if s.min_tokens:
        kw["min_tokens"] = s.min_tokens
    # Further eos ids (e.g. Llama 3's <|eot_id|>) stop like the end id does; the backend reports them as eos.
    stop_ids = list(s.stop_token_ids)
    if not s.ignore_eos:
        stop_ids += [t for t in ctx.eos_token_ids[1:] if t not in stop_ids]
    if stop_ids:
        kw["stop_token_ids"] = stop_ids
    if s.bad_words:
        kw["bad"] = bad_word_strings(s.bad_words)
    if s.beam_width > 1:
        if s.beam_width > ctx.max_beam_width:
            raise InvalidRequestError(
                f"beam_width {s.beam_width} exceeds the engine's max_beam_width {ctx.max_beam_width}",
                param="beam_width")
        if s.n not in (1, s.beam_width):
            raise InvalidRequestError("with beam search, n must equal beam_width", param="n")
        kw.update(use_beam_search=True, n=s.beam_width, best_of=s.beam_width)
        if s.length_penalty != 1.0:
            kw["length_penalty"] = s.length_penalty
    elif s.n > 1:
        kw["n"] = s.n
    if s.logprobs is not None:
        # Ask for at least one: 0 means "the sampled token only", which every entry carries anyway.
        kw["logprobs"] = max(s.logprobs, 1)
    if s.prompt_logprobs is not None:
        kw["prompt_logprobs"] = max(s.prompt_logprobs, 1)
    if s.return_context_logits:
        kw["return_context_logits"] = True
    if s.return_generation_logits:
        kw["return_generation_logits"] = True
    return kw


def embedding_bias(logit_bias: dict[int, float], vocab_size: int) -> Any:
    """logit_bias -> the float32 [vocab] tensor SamplingParams.embedding_bias takes."""
    import torch

    bias = torch.zeros(vocab_size, dtype=torch.float32)
    for token, value in logit_bias.items():
        if not 0 <= int(token) < vocab_size:
            raise InvalidRequestError(f"logit_bias token id {token} is outside the vocabulary", "logit_bias")
        bias[int(token)] = float(value)
    return bias


def guided_params(api: TrtllmApi, request: GenerationRequest) -> Any:
    """GuidedDecoding -> GuidedDecodingParams (None when unconstrained), as trtllm-serve maps response_format.

    TensorRT-LLM compiles the guides itself (xgrammar); its JSON grammars allow free whitespace between
    tokens, where the native runtime writes compact JSON (runtime/native/guided/grammars.py).
    """
    g = request.guided
    if g is None:
        return None
    if g.json_schema is not None:
        return api.GuidedDecodingParams(json=g.json_schema)
    if g.json_object:
        return api.GuidedDecodingParams(json_object=True)
    if g.regex is not None:
        return api.GuidedDecodingParams(regex=g.regex)
    if g.grammar is not None:
        return api.GuidedDecodingParams(grammar=g.grammar)
    if g.structural_tag is not None:  # tool calls (adapters/openai/tools.py); TensorRT-LLM takes it as JSON text
        return api.GuidedDecodingParams(structural_tag=json.dumps(g.structural_tag))
    return None


def build_sampling_params(api: TrtllmApi, request: GenerationRequest, prompt_len: int,
                          ctx: SamplingContext) -> Any:
    """The SamplingParams object for `request`."""
    kw = sampling_kwargs(request, prompt_len, ctx)
    if request.sampling.logit_bias:
        kw["embedding_bias"] = embedding_bias(request.sampling.logit_bias, ctx.vocab_size)
    guided = guided_params(api, request)
    if guided is not None:
        kw["guided_decoding"] = guided
    return api.SamplingParams(**kw)
