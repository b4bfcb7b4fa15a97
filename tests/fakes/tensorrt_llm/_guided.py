"""The fake's guided decoding: TensorRT-LLM's PyTorch backend with guided_decoding_backend="xgrammar".

Real (NVIDIA/TensorRT-LLM @ 000a01de66f0eab4ab05640711f0253f50f5209c):
- tensorrt_llm/sampling_params.py, SamplingParams._get_guided_decoding_params: GuidedDecodingParams -> an
  executor guide (json_object -> JSON; json -> JSON_SCHEMA, a dict json.dumps'ed, a pydantic model's schema;
  regex; grammar -> EBNF_GRAMMAR; structural_tag as given);
- tensorrt_llm/_torch/pyexecutor/grammar_matcher.py, XGrammarMatcherFactory.create: which xgrammar compile
  call each guide type gets, and one GrammarMatcher per request.
The real GuidedDecoder fills each request's bitmask and applies it to the logits before sampling, and
advances the matcher with the sampled token.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import xgrammar
from pydantic import BaseModel

from tensorrt_llm.sampling_params import GuidedDecodingParams


class GuidedDecoder:
    """Compiles guides against one tokenizer and masks one row of logits per matcher."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                       stop_token_ids=stop_token_ids)
        self._compiler = xgrammar.GrammarCompiler(info, cache_enabled=True)
        self._vocab_size = vocab_size

    def matcher(self, params: GuidedDecodingParams) -> xgrammar.GrammarMatcher:
        if params.json_object:
            compiled = self._compiler.compile_builtin_json_grammar()
        elif params.json is not None:
            schema = params.json
            if isinstance(schema, BaseModel):
                schema = schema.model_json_schema()
            if isinstance(schema, dict):
                schema = json.dumps(schema)
            compiled = self._compiler.compile_json_schema(schema)
        elif params.regex is not None:
            compiled = self._compiler.compile_regex(params.regex)
        elif params.grammar is not None:
            compiled = self._compiler.compile_grammar(params.grammar)
        elif params.structural_tag is not None:
            compiled = self._compiler.compile_structural_tag(params.structural_tag)
        else:
            raise ValueError("GuidedDecodingParams without a guide")
        return xgrammar.GrammarMatcher(compiled)

    def mask(self, matcher: xgrammar.GrammarMatcher, logits: torch.Tensor) -> None:
        """Set the tokens the grammar forbids next to -inf (logits [vocab], in place)."""
        if matcher.is_terminated():
            return
        bitmask = xgrammar.allocate_token_bitmask(1, self._vocab_size)
        matcher.fill_next_token_bitmask(bitmask)
        xgrammar.apply_token_bitmask_inplace(logits[None], bitmask, vocab_size=logits.shape[-1])
