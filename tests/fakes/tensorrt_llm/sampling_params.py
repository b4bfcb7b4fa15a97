"""SamplingParams and GuidedDecodingParams (real: NVIDIA/TensorRT-LLM tensorrt_llm/sampling_params.py
@ a98a9061d72f6fd39f5d055ebdd2c6878a100e2c), fields, defaults and checks as there.

Behaviour kept from the real file:
- __post_init__: pad_id defaults to end_id, best_of to n, embedding_bias is copied; then _validate: 0 <= top_p
  <= 1, top_k >= 0, temperature >= 0, best_of >= n, no best_of > 1 under greedy decoding (temperature 0,
  top_k 1, top_p 0, or no sampling knob at all) unless TLLM_ALLOW_N_GREEDY_DECODING is set, truncate_prompt_tokens
  >= 1, one guide at most.
- _setup (which LLM calls only when end_id is None) fills end_id/pad_id from the tokenizer and tokenizes `bad`
  and `stop`; _get_bad_words / _get_stop_words raise when `bad` / `stop` were never tokenized.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any, List, Optional, Tuple, Union

import torch


@dataclass(slots=True, kw_only=True)
class GuidedDecodingParams:
    """Exactly one of the fields constrains the output."""

    json: Optional[Union[str, dict, Any]] = None
    regex: Optional[str] = None
    grammar: Optional[str] = None
    json_object: bool = False
    structural_tag: Optional[str] = None

    def _validate(self) -> None:
        num = sum(bool(getattr(self, f.name)) for f in fields(self))
        if num > 1:
            raise ValueError(f"Only one guide can be used for a request, but got {num}.")


@dataclass(slots=True, kw_only=True)
class SamplingParams:
    """Sampling parameters for text generation (real field names, order and defaults)."""

    end_id: Optional[int] = None
    pad_id: Optional[int] = None
    max_tokens: int = 32
    bad: Optional[Union[str, List[str]]] = None
    bad_token_ids: Optional[List[int]] = None
    _bad_word_ids: Optional[List[List[int]]] = field(default=None, init=False, repr=False)
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    include_stop_str_in_output: bool = False
    _stop_word_ids: Optional[List[List[int]]] = field(default=None, init=False, repr=False)

    embedding_bias: Optional[Any] = None  # torch.Tensor float32 [vocab]
    logits_processor: Optional[Any] = None
    apply_batched_logits_processor: bool = False

    n: int = 1
    best_of: Optional[int] = None
    use_beam_search: bool = False

    top_k: Optional[int] = None
    top_p: Optional[float] = None
    top_p_min: Optional[float] = None
    top_p_reset_ids: Optional[int] = None
    top_p_decay: Optional[float] = None
    seed: Optional[int] = None
    temperature: Optional[float] = None
    min_tokens: Optional[int] = None
    beam_search_diversity_rate: Optional[float] = None
    repetition_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    length_penalty: Optional[float] = None
    early_stopping: Optional[int] = None
    no_repeat_ngram_size: Optional[int] = None
    min_p: Optional[float] = None
    beam_width_array: Optional[List[int]] = None

    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    return_context_logits: bool = False
    return_generation_logits: bool = False
    exclude_input_from_output: bool = True
    return_encoder_output: bool = False
    return_perf_metrics: bool = False
    additional_model_outputs: Optional[List[str]] = None

    # TRT flow: logits turned on only to compute logprobs, dropped afterwards
    _context_logits_auto_enabled: bool = False
    _generation_logits_auto_enabled: bool = False
    _return_log_probs: bool = False

    lookahead_config: Optional[Any] = None
    guided_decoding: Optional[GuidedDecodingParams] = None

    ignore_eos: bool = False
    detokenize: bool = True
    add_special_tokens: bool = True
    truncate_prompt_tokens: Optional[int] = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    _stream_interval: Optional[int] = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.pad_id is None:
            self.pad_id = self.end_id
        self.best_of = self.best_of or self.n
        if self.embedding_bias is not None:
            if isinstance(self.embedding_bias, torch.Tensor):
                self.embedding_bias = self.embedding_bias.detach().clone()
            else:
                self.embedding_bias = torch.tensor(self.embedding_bias, dtype=torch.float32)
        self._validate()

    def _validate(self) -> None:
        if self.top_p is not None and (self.top_p < 0 or self.top_p > 1):
            raise ValueError(f"require 0 <= top_p <= 1, got top_p={self.top_p}")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"require top_k >= 0, got top_k={self.top_k}")
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"require temperature >= 0, got temperature={self.temperature}")
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) cannot be less than n ({self.n})")
        if (self.best_of is not None and self.best_of > 1 and self._greedy_decoding
                and not os.environ.get("TLLM_ALLOW_N_GREEDY_DECODING", None)):
            raise ValueError(
                f"Greedy decoding in the LLM API does not allow multiple returns. Please set to best_of=1, "
                f"got best_of={self.best_of}. Please set to best_of=1 or set an environment variable "
                f"TLLM_ALLOW_N_GREEDY_DECODING=1 to allow best_of > 1 under the greedy decoding.")
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1:
            raise ValueError(f"truncate_prompt_tokens must be >= 1, got {self.truncate_prompt_tokens}")
        if self.guided_decoding is not None:
            self.guided_decoding._validate()
        # correct types as users might pass in logprob=True for Top-1 logprobs
        self.logprobs = self.logprobs and int(self.logprobs)
        self.prompt_logprobs = self.prompt_logprobs and int(self.prompt_logprobs)

    @staticmethod
    def params_imply_greedy_decoding(*, temperature: Optional[float], top_p: Optional[float],
                                     top_k: Optional[int]) -> bool:
        return ((temperature is None and top_p is None and top_k is None) or top_k == 1 or top_p == 0.0
                or temperature == 0)

    @property
    def _greedy_decoding(self) -> bool:
        return not self.use_beam_search and self.params_imply_greedy_decoding(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)

    @property
    def _need_return_context_logits(self) -> bool:
        return self.return_context_logits and not self._context_logits_auto_enabled

    @property
    def _need_return_generation_logits(self) -> bool:
        return self.return_generation_logits and not self._generation_logits_auto_enabled

    def _setup(self, tokenizer: Any, hf_model_config: Any, generation_config: Any,
               add_special_tokens: bool = False) -> "SamplingParams":
        if self.end_id is None:
            self.end_id = tokenizer.eos_token_id
            self.pad_id = tokenizer.pad_token_id
            if self.pad_id is None:
                self.pad_id = self.end_id
        if self.bad is not None:
            strs = [self.bad] if isinstance(self.bad, str) else self.bad
            self._bad_word_ids = [tokenizer.encode(s, add_special_tokens=add_special_tokens) for s in strs]
        if self.stop is not None:
            strs = [self.stop] if isinstance(self.stop, str) else self.stop
            self._stop_word_ids = [tokenizer.encode(s, add_special_tokens=add_special_tokens) for s in strs]
        return self

    def _get_bad_words(self) -> List[List[int]]:
        words = [[i] for i in self.bad_token_ids] if self.bad_token_ids else []
        if self.bad is None:
            return words
        if self._bad_word_ids is None:
            raise RuntimeError(f"{self.__class__.__name__}.bad ({self.bad}) is not processed by tokenizer, "
                               "please call the setup method.")
        return words + self._bad_word_ids

    def _get_stop_words(self) -> List[List[int]]:
        words = [[i] for i in self.stop_token_ids] if self.stop_token_ids else []
        if self.stop is None:
            return words
        if self._stop_word_ids is None:
            raise RuntimeError(f"{self.__class__.__name__}.stop ({self.stop}) is not processed by tokenizer, "
                               "please call the setup method.")
        return words + self._stop_word_ids

    def _get_stop_reasons_and_words(self) -> List[Tuple[Union[str, int], List[int]]]:
        reasons: List[Union[str, int]] = list(self.stop_token_ids or [])
        if self.stop is not None:
            reasons += [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return list(zip(reasons, self._get_stop_words()))
