"""Config classes of the LLM constructor (real: NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py, 1.2 line,
stored-file id 1090804222 of the search index, which gave no commit, for the LLM arguments, KvCacheConfig and
SchedulerConfig; stored-file id 7019226376 for the speculative decoding configs; pydantic models with
extra="forbid"), with the real field names, defaults and validators for every field the fake carries.

TORCH_LLM_ARGS / TRT_LLM_ARGS: the keyword arguments the real LLM classes accept (the fields of
TorchLlmArgs / TrtLlmArgs). The fake LLM rejects any other keyword, as the real one does.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import List, Literal, Optional, Set, Union

from pydantic import (AliasChoices, BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt,
                      PositiveInt, model_validator)

_SNAPSHOT = Path(__file__).resolve().parents[2] / "trtllm_api_snapshot.json"


def _llm_arg_names(key: str) -> frozenset[str]:
    with open(_SNAPSHOT, encoding="utf-8") as f:
        return frozenset(json.load(f)["classes"][key]["fields"])


TORCH_LLM_ARGS = _llm_arg_names("TorchLlmArgs")
TRT_LLM_ARGS = _llm_arg_names("TrtLlmArgs")


class StrictBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


class CapacitySchedulerPolicy(str, Enum):
    MAX_UTILIZATION = "MAX_UTILIZATION"
    GUARANTEED_NO_EVICT = "GUARANTEED_NO_EVICT"
    STATIC_BATCH = "STATIC_BATCH"


class ContextChunkingPolicy(str, Enum):
    FIRST_COME_FIRST_SERVED = "FIRST_COME_FIRST_SERVED"
    EQUAL_PROGRESS = "EQUAL_PROGRESS"


class DynamicBatchConfig(StrictBaseModel):
    enable_batch_size_tuning: bool
    enable_max_num_tokens_tuning: bool
    dynamic_batch_moving_average_window: int


class SchedulerConfig(StrictBaseModel):
    capacity_scheduler_policy: CapacitySchedulerPolicy = CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
    context_chunking_policy: Optional[ContextChunkingPolicy] = None
    dynamic_batch_config: Optional[DynamicBatchConfig] = None


class KvCacheConfig(StrictBaseModel):
    enable_block_reuse: bool = True
    max_tokens: Optional[int] = None
    max_attention_window: Optional[List[int]] = None
    sink_token_length: Optional[int] = None
    free_gpu_memory_fraction: Optional[float] = Field(default=0.9, ge=0, le=1)
    host_cache_size: Optional[int] = None
    onboard_blocks: bool = True
    cross_kv_cache_fraction: Optional[float] = None
    secondary_offload_min_priority: Optional[int] = None
    event_buffer_max_size: int = 0
    attention_dp_events_gather_period_ms: int = 5
    enable_partial_reuse: bool = True
    copy_on_partial_reuse: bool = True
    use_uvm: bool = False
    max_gpu_total_bytes: int = 0
    dtype: str = "auto"
    mamba_ssm_cache_dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"
    tokens_per_block: int = 32


class CudaGraphConfig(StrictBaseModel):
    batch_sizes: Optional[List[int]] = None
    max_batch_size: int = 0
    enable_padding: bool = False


class DecodingBaseConfig(StrictBaseModel):
    """Speculative decoding configs follow llm_args.py at stored-file id 7019226376 (1.2 line): the draft model
    field is `speculative_model` (`speculative_model_dir` still accepted), `decoding_type` is a field, and each
    config says which LLM backend runs it (BaseLlmArgs.validate_speculative_config refuses the others)."""

    max_draft_len: Optional[NonNegativeInt] = None
    max_total_draft_tokens: Optional[int] = None
    speculative_model: Optional[Union[str, Path]] = Field(
        default=None, validation_alias=AliasChoices("speculative_model", "speculative_model_dir"))
    max_concurrency: Optional[NonNegativeInt] = None
    draft_len_schedule: Optional[dict[int, int]] = None
    load_format: Optional[str] = None
    acceptance_window: Optional[NonNegativeInt] = None
    acceptance_length_threshold: Optional[NonNegativeFloat] = None
    allow_advanced_sampling: bool = False

    def supports_backend(self, backend: Optional[str]) -> bool:
        return True


class NGramDecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["NGram"] = "NGram"
    max_matching_ngram_size: PositiveInt = 2
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True

    @model_validator(mode="after")
    def validate_ngram_config(self) -> "NGramDecodingConfig":
        if self.max_draft_len is None or self.max_draft_len <= 0:
            raise ValueError("max_draft_len must be > 0 for NGram")
        self.max_total_draft_tokens = self.max_draft_len
        return self

    def supports_backend(self, backend: Optional[str]) -> bool:
        return backend == "pytorch"


class DraftTargetDecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["Draft_Target"] = "Draft_Target"

    @model_validator(mode="after")
    def validate_draft_target_config(self) -> "DraftTargetDecodingConfig":
        if self.max_draft_len is None or self.max_draft_len <= 0:
            raise ValueError("max_draft_len must be > 0 for DraftTarget")
        if self.speculative_model is None:
            raise ValueError("speculative_model must be specified for DraftTarget")
        self.max_total_draft_tokens = self.max_draft_len
        return self

    def supports_backend(self, backend: Optional[str]) -> bool:
        return backend == "pytorch" or backend == "_autodeploy"


class EagleDecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["Eagle"] = "Eagle"
    eagle_choices: Optional[List[List[int]]] = None
    greedy_sampling: Optional[bool] = True
    posterior_threshold: Optional[float] = None
    use_dynamic_tree: Optional[bool] = False
    dynamic_tree_max_topK: Optional[int] = None
    num_eagle_layers: Optional[int] = None
    max_non_leaves_per_layer: Optional[int] = None
    eagle3_one_model: Optional[bool] = True
    eagle3_layers_to_capture: Optional[Set[int]] = None
    eagle3_model_arch: Literal["llama3", "mistral_large3"] = "llama3"

    @model_validator(mode="after")
    def validate_eagle_config(self) -> "EagleDecodingConfig":
        if self.max_draft_len is None or self.max_draft_len == 0:
            raise ValueError("max_draft_len must be > 0 for Eagle")
        self.num_eagle_layers = self.max_draft_len
        self.max_total_draft_tokens = self.max_draft_len
        if self.speculative_model is None:
            raise ValueError("Draft model must be provided for EAGLE")
        return self


class MedusaDecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["Medusa"] = "Medusa"
    medusa_choices: Optional[List[List[int]]] = None
    num_medusa_heads: Optional[int] = None

    @model_validator(mode="after")
    def set_max_total_draft_tokens(self) -> "MedusaDecodingConfig":
        self.max_total_draft_tokens = self.max_draft_len
        return self

    def supports_backend(self, backend: Optional[str]) -> bool:
        return backend not in ("pytorch", "_autodeploy")


class LookaheadDecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["Lookahead"] = "Lookahead"
    max_window_size: PositiveInt = 4
    max_ngram_size: PositiveInt = 3
    max_verification_set_size: PositiveInt = 4

    @model_validator(mode="after")
    def set_max_total_draft_tokens(self) -> "LookaheadDecodingConfig":
        self.max_total_draft_tokens = self.max_draft_len
        return self

    def supports_backend(self, backend: Optional[str]) -> bool:
        return backend not in ("pytorch", "_autodeploy")


class MTPDecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["MTP"] = "MTP"
    num_nextn_predict_layers: PositiveInt = 1
    use_relaxed_acceptance_for_thinking: bool = False
    relaxed_topk: int = 1
    relaxed_delta: float = 0.0
    use_mtp_vanilla: bool = False
    mtp_eagle_one_model: bool = True
    num_nextn_predict_layers_from_model_config: int = 1
    begin_thinking_phase_token: int = 128798
    end_thinking_phase_token: int = 128799

    @model_validator(mode="after")
    def set_max_total_draft_tokens(self) -> "MTPDecodingConfig":
        self.max_draft_len = self.num_nextn_predict_layers
        self.max_total_draft_tokens = self.num_nextn_predict_layers
        return self

    def supports_backend(self, backend: Optional[str]) -> bool:
        return backend == "pytorch"
