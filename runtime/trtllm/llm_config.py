"""EngineConfig -> the `LLM(...)` class and keyword arguments (TensorRT-LLM 1.2 LLM API).

Field names: TorchLlmArgs / TrtLlmArgs, KvCacheConfig, SchedulerConfig, LoraConfig and the speculative
decoding configs of NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py (1.2 line; see
tests/fakes/trtllm_api_snapshot.json for the stored version read).

| EngineConfig | LLM argument |
|---|---|
| model (HF folder / engine folder) | `model` of tensorrt_llm.LLM / tensorrt_llm._tensorrt_engine.LLM |
| tokenizer | `tokenizer` |
| dtype, tensor_parallel_size, pipeline_parallel_size | same names |
| max_batch_size, max_num_tokens, max_beam_width | same names |
| max_model_len | `max_seq_len` |
| kv_cache_fraction / max_kv_tokens / enable_prefix_caching | KvCacheConfig free_gpu_memory_fraction / max_tokens / enable_block_reuse |
| kv_block_size | KvCacheConfig.tokens_per_block (checkpoints; an engine's is fixed by trtllm-build) |
| kv_cache_dtype=fp8 | KvCacheConfig.dtype="fp8" (checkpoints; an engine's is fixed when it is built: refused) |
| scheduler_policy | SchedulerConfig(capacity_scheduler_policy=MAX_UTILIZATION / GUARANTEED_NO_EVICT) |
| enable_chunked_prefill | `enable_chunked_prefill` |
| lora_modules, max_lora_rank, max_loras, max_cpu_loras | LoraConfig(lora_dir, max_lora_rank, max_loras, max_cpu_loras, lora_target_modules) |
| speculative=draft, draft_model, num_draft_tokens, speculative_max_concurrency | DraftTargetDecodingConfig(max_draft_len, speculative_model[_dir], max_concurrency) |
| speculative=ngram, num_draft_tokens, ngram_max, speculative_max_concurrency | NGramDecodingConfig(max_draft_len, max_matching_ngram_size, max_concurrency) |
| enable_cuda_graphs=false | `cuda_graph_config=None` (checkpoints) |
| trtllm_extra | passed through; `speculative_config` may be a dict with `decoding_type` Eagle/Medusa/Lookahead/MTP/... |
| device=cpu, ngram_min != 1, speculation the folder's flow cannot run (draft, ngram: checkpoints only) | refused |
Always set: `guided_decoding_backend="xgrammar"`; checkpoints: `enable_iter_perf_stats=True` (feeds /metrics;
TrtLlmArgs has no such field, an engine's runtime reports iteration stats anyway); engine folders:
`gather_generation_logits=True` (TensorRT-LLM refuses logprobs without it).
"""

from __future__ import annotations

from typing import Any

from runtime.config import EngineConfig
from runtime.errors import InvalidRequestError, UnsupportedOptionError
from runtime.trtllm.api import TrtllmApi
from runtime.trtllm.lora import TrtllmAdapters
from runtime.trtllm.model_folder import ModelFolder

BACKEND = "trtllm"
# the tokens a step holds when --max-num-tokens is not given (None to the LLM API): TensorRT-LLM's BuildConfig default
TRTLLM_MAX_NUM_TOKENS = 8192
_MERGED_EXTRAS = ("kv_cache_config", "scheduler_config", "lora_config")


def _speculative_model_field(config_cls: Any) -> str:
    # 1.2-era releases name it speculative_model_dir; later ones speculative_model. Use whichever the
    # installed class declares so the same gateway works across the 1.2.x patch releases.
    fields = getattr(config_cls, "model_fields", {})
    return "speculative_model" if "speculative_model" in fields else "speculative_model_dir"


def speculative_config(api: TrtllmApi, config: EngineConfig, folder: ModelFolder) -> Any:
    """The speculative decoding config for `config.speculative` (None when off)."""
    if config.speculative == "none":
        return None
    if folder.is_engine:  # TensorRT-LLM's DraftTarget and NGram configs support its PyTorch flow only
        raise UnsupportedOptionError(
            "speculative", BACKEND, f"'{config.speculative}' speculation runs on TensorRT-LLM's PyTorch flow only "
            "(a Hugging Face checkpoint folder); a TensorRT engine folder speculates with the heads it was built "
            "with (--trtllm-extra '{\"speculative_config\": {\"decoding_type\": \"Medusa\", ...}}')")
    if config.speculative == "draft":
        if not config.draft_model:
            raise InvalidRequestError("--speculative draft needs --draft-model", param="draft_model")
        cls = api.DraftTargetDecodingConfig
        return cls(max_draft_len=config.num_draft_tokens, max_concurrency=config.speculative_max_concurrency,
                   **{_speculative_model_field(cls): config.draft_model})
    if config.ngram_min != 1:
        raise UnsupportedOptionError("ngram_min", BACKEND,
                                     "TensorRT-LLM's n-gram drafter matches from ngram_max down to 1")
    return api.NGramDecodingConfig(max_draft_len=config.num_draft_tokens, max_matching_ngram_size=config.ngram_max,
                                   max_concurrency=config.speculative_max_concurrency)


def _extra_speculative(api: TrtllmApi, value: Any) -> Any:
    """A trtllm_extra speculative_config given as a dict {decoding_type: ..., ...} -> its config class."""
    if not isinstance(value, dict):
        return value
    classes = {"Eagle": api.EagleDecodingConfig, "Medusa": api.MedusaDecodingConfig,
               "Lookahead": api.LookaheadDecodingConfig, "MTP": api.MTPDecodingConfig,
               "NGram": api.NGramDecodingConfig, "DraftTarget": api.DraftTargetDecodingConfig}
    data = dict(value)
    kind = data.pop("decoding_type", None)
    if kind not in classes:
        raise InvalidRequestError(
            f"trtllm_extra.speculative_config.decoding_type must be one of {sorted(classes)}, got {kind!r}",
            param="trtllm_extra")
    if classes[kind] is None:
        raise UnsupportedOptionError("trtllm_extra", BACKEND, f"TensorRT-LLM {api.version} has no {kind} speculative "
                                     "decoding config")
    return classes[kind](**data)


def _check_speculation_runs(spec: Any, folder: ModelFolder) -> None:
    """Refuse at start-up a config TensorRT-LLM would refuse when building the LLM (its supports_backend:
    the PyTorch flow runs checkpoints, backend "pytorch"; the TensorRT flow runs engines, backend None)."""
    supports = getattr(spec, "supports_backend", None)
    if supports is not None and not supports(None if folder.is_engine else "pytorch"):
        kind = getattr(spec, "decoding_type", type(spec).__name__)
        where = "a TensorRT engine folder" if folder.is_engine else "a Hugging Face checkpoint folder (PyTorch flow)"
        raise UnsupportedOptionError("trtllm_extra", BACKEND, f"TensorRT-LLM's {kind} speculation does not run on "
                                     f"{where}")


def llm_arguments(api: TrtllmApi, config: EngineConfig, folder: ModelFolder,
                  adapters: TrtllmAdapters) -> tuple[Any, dict[str, Any]]:
    """(LLM class, keyword arguments) for `config` over `folder`."""
    if config.device == "cpu":
        raise UnsupportedOptionError("device", BACKEND, "TensorRT-LLM runs on NVIDIA GPUs only")
    if config.device.startswith("cuda:") and config.device != "cuda:0":
        raise UnsupportedOptionError("device", BACKEND, "select the GPU with CUDA_VISIBLE_DEVICES")
    kv: dict[str, Any] = dict(free_gpu_memory_fraction=config.kv_cache_fraction,
                              max_tokens=config.max_kv_tokens,
                              enable_block_reuse=config.enable_prefix_caching)
    if not folder.is_engine:
        kv["tokens_per_block"] = config.kv_block_size
    if config.kv_cache_dtype == "fp8":  # KvCacheConfig.dtype: read by the PyTorch flow only
        if folder.is_engine:
            raise UnsupportedOptionError("kv_cache_dtype", BACKEND, "a TensorRT engine's KV cache dtype is set when "
                                         "it is built (quantize.py --kv_cache_dtype fp8)")
        kv["dtype"] = "fp8"
    policy = {"max_utilization": api.CapacitySchedulerPolicy.MAX_UTILIZATION,
              "guaranteed_no_evict": api.CapacitySchedulerPolicy.GUARANTEED_NO_EVICT}[config.scheduler_policy]
    sched: dict[str, Any] = dict(capacity_scheduler_policy=policy)
    lora: dict[str, Any] | None = None
    if adapters.enabled:
        lora = dict(lora_dir=list(adapters.adapters().values()), max_lora_rank=config.max_lora_rank,
                    max_loras=config.max_loras, max_cpu_loras=config.max_cpu_loras,
                    lora_target_modules=list(adapters.target_modules))

    extra = dict(config.trtllm_extra)
    for key, ours in (("kv_cache_config", kv), ("scheduler_config", sched), ("lora_config", lora)):
        if isinstance(extra.get(key), dict):  # a dict in trtllm_extra adds to (and overrides) ours
            merged = {**(ours or {}), **extra.pop(key)}
            if key == "kv_cache_config":
                kv = merged
            elif key == "scheduler_config":
                sched = merged
            else:
                lora = merged
    spec = speculative_config(api, config, folder)
    if "speculative_config" in extra:
        if spec is not None:
            raise InvalidRequestError("give either --speculative or trtllm_extra.speculative_config",
                                      param="trtllm_extra")
        spec = _extra_speculative(api, extra.pop("speculative_config"))
        _check_speculation_runs(spec, folder)

    kwargs: dict[str, Any] = dict(
        model=folder.path, tokenizer=folder.tokenizer_path, dtype=config.dtype,
        tensor_parallel_size=config.tensor_parallel_size,
        pipeline_parallel_size=config.pipeline_parallel_size,
        max_batch_size=config.max_batch_size, max_num_tokens=config.max_num_tokens,
        max_beam_width=config.max_beam_width, max_seq_len=folder.context_window,
        kv_cache_config=api.KvCacheConfig(**kv), scheduler_config=api.SchedulerConfig(**sched),
        enable_chunked_prefill=config.enable_chunked_prefill,
        guided_decoding_backend="xgrammar",
    )
    if lora is not None:
        kwargs["lora_config"] = api.LoraConfig(**lora)
        if folder.is_engine:
            kwargs["enable_lora"] = True
    if spec is not None:
        kwargs["speculative_config"] = spec
    if config.stream_interval > 1:
        if folder.is_engine:  # TrtLlmArgs has no such field (and refuses unknown ones)
            raise UnsupportedOptionError("stream_interval", BACKEND,
                                         "a TensorRT engine folder streams every token; the PyTorch flow takes it")
        kwargs["stream_interval"] = config.stream_interval
    if folder.is_engine:
        kwargs["gather_generation_logits"] = True  # TensorRT-LLM computes the engine's logprobs from them
    else:
        kwargs["enable_iter_perf_stats"] = True
        if not config.enable_cuda_graphs:
            kwargs["cuda_graph_config"] = None
    kwargs.update(extra)
    return (api.TrtLLM if folder.is_engine else api.LLM), kwargs
