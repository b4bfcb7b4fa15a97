"""Config classes of the LLM constructor (real: NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py, 1.2 line,
stored-file id 1090804222 of the search index, which gave no commit; pydantic models with
extra="forbid"), with the real field names and defaults for every field the fake carries.

TORCH_LLM_ARGS / TRT_LLM_ARGS: the keyword arguments the real LLM classes accept (the fields of
TorchLlmArgs / TrtLlmArgs). The fake LLM rejects any other keyword, as the real one does.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import ClassVar, List, Literal, Optional, Set, Union

from pydantic import BaseModel, ConfigDict, Field

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
    max_draft_len: Optional[int] = None
    max_total_draft_tokens: Optional[int] = None
    speculative_model_dir: Optional[Union[str, Path]] = None
    max_concurrency: Optional[int] = None
    load_format: Optional[str] = None
    acceptance_window: Optional[int] = None
    acceptance_length_threshold: Optional[float] = None

    decoding_type: ClassVar[str] = ""


class DraftTargetDecodingConfig(DecodingBaseConfig):
    decoding_type: ClassVar[str] = "Draft_Target"


class NGramDecodingConfig(DecodingBaseConfig):
    max_matching_ngram_size: int = 0
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True

    decoding_type: ClassVar[str] = "NGram"


class EagleDecodingConfig(DecodingBaseConfig):
    eagle_choices: Optional[List[List[int]]] = None
    greedy_sampling: Optional[bool] = True
    posterior_threshold: Optional[float] = None
    use_dynamic_tree: Optional[bool] = False
    dynamic_tree_max_topK: Optional[int] = None
    num_eagle_layers: Optional[int] = None
    max_non_leaves_per_layer: Optional[int] = None
    eagle3_one_model: Optional[bool] = True
    eagle3_layers_to_capture: Optional[Set[int]] = None

    decoding_type: ClassVar[str] = "Eagle"


class MedusaDecodingConfig(DecodingBaseConfig):
    medusa_choices: Optional[List[List[int]]] = None
    num_medusa_heads: Optional[int] = None

    decoding_type: ClassVar[str] = "Medusa"


class LookaheadDecodingConfig(DecodingBaseConfig):
    max_window_size: int = 4
    max_ngram_size: int = 3
    max_verification_set_size: int = 4

    decoding_type: ClassVar[str] = "Lookahead"


class MTPDecodingConfig(DecodingBaseConfig):
    num_nextn_predict_layers: int = 1
    use_relaxed_acceptance_for_thinking: bool = False
    relaxed_topk: int = 1
    relaxed_delta: float = 0.0
    use_mtp_vanilla: bool = False
    mtp_eagle_one_model: bool = True

    decoding_type: ClassVar[str] = "MTP"
