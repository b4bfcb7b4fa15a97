"""SamplingParams and GuidedDecodingParams with the real field names and defaults.

Real: NVIDIA/TensorRT-LLM tensorrt_llm/sampling_params.py @ a98a9061d72f6fd39f5d055ebdd2c6878a100e2c. Both are
`@dataclass(slots=True, kw_only=True)` there; `None` for a sampling knob means "the runtime default".
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, List, Optional, Union


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

    lookahead_config: Optional[Any] = None
    guided_decoding: Optional[GuidedDecodingParams] = None

    ignore_eos: bool = False
    detokenize: bool = True
    add_special_tokens: bool = True
    truncate_prompt_tokens: Optional[int] = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True

    def __post_init__(self) -> None:
        # The real class validates these in __post_init__ (_validate) as well.
        if self.best_of is None:
            self.best_of = self.n
        if self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) cannot be less than n ({self.n})")
        if self.guided_decoding is not None:
            self.guided_decoding._validate()

    def _setup(self, tokenizer: Any) -> "SamplingParams":
        """Fill end_id/pad_id and tokenize stop/bad words, as LLM does before submitting."""
        if self.end_id is None:
            self.end_id = tokenizer.eos_token_id
            self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.end_id

        def words(value: Optional[Union[str, List[str]]]) -> List[List[int]]:
            items = [value] if isinstance(value, str) else list(value or [])
            return [tokenizer.encode(w, add_special_tokens=False) for w in items]

        self._stop_word_ids = words(self.stop)
        self._bad_word_ids = words(self.bad)
        return self

    def _get_stop_reasons_and_words(self) -> List[tuple]:
        """(reason, token ids) pairs: stop token ids first, then stop strings."""
        out: List[tuple] = [(t, [t]) for t in (self.stop_token_ids or [])]
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        out += list(zip(stops, self._stop_word_ids or []))
        return out
