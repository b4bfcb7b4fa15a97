"""Server options -> `LLM(...)` arguments of the TensorRT-LLM backend (runtime/trtllm/llm_config.py), value by
value, on the fake tensorrt_llm (whose config classes have the real field names and reject unknown ones)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.config import EngineConfig
from runtime.errors import InvalidRequestError, UnsupportedOptionError
from runtime.trtllm.api import load_api
from runtime.trtllm.llm_config import llm_arguments
from runtime.trtllm.lora import TrtllmAdapters
from runtime.trtllm.model_folder import ModelFolder
from tests.fakes.trtllm import engine_folder, fake_trtllm  # noqa: F401  (fixture)
from tests.tiny_models import build_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("trtllm_args"), "llama")


def arguments(config: EngineConfig, tokenizer: str | None = None):
    folder = ModelFolder.inspect(config.model, tokenizer, config.max_model_len)
    return llm_arguments(load_api(), config, folder, TrtllmAdapters(config.lora_modules, config.max_lora_rank))


def test_checkpoint_folder_options_reach_their_llm_arguments(fake_trtllm, model_dir) -> None:
    api = load_api()
    config = EngineConfig(
        model=str(model_dir), backend="trtllm", device="cuda", dtype="bfloat16", max_model_len=100,
        max_batch_size=12, max_num_tokens=1024, max_beam_width=2, kv_cache_fraction=0.7, max_kv_tokens=2048,
        enable_prefix_caching=False, kv_block_size=32, scheduler_policy="guaranteed_no_evict",
        enable_chunked_prefill=False, tensor_parallel_size=2, pipeline_parallel_size=2, speculative="ngram",
        num_draft_tokens=3, ngram_max=5, speculative_max_concurrency=4, enable_cuda_graphs=False, stream_interval=4)
    cls, kw = arguments(config)
    assert cls is api.LLM
    assert (kw["model"], kw["tokenizer"], kw["dtype"], kw["max_seq_len"]) == (str(model_dir), str(model_dir),
                                                                              "bfloat16", 100)
    assert (kw["max_batch_size"], kw["max_num_tokens"], kw["max_beam_width"]) == (12, 1024, 2)
    assert (kw["tensor_parallel_size"], kw["pipeline_parallel_size"]) == (2, 2)
    kv = kw["kv_cache_config"]
    assert (kv.free_gpu_memory_fraction, kv.max_tokens, kv.enable_block_reuse, kv.tokens_per_block) == (
        0.7, 2048, False, 32)
    assert kw["scheduler_config"].capacity_scheduler_policy == api.CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
    assert kw["enable_chunked_prefill"] is False
    spec = kw["speculative_config"]
    assert isinstance(spec, api.NGramDecodingConfig)
    assert (spec.max_draft_len, spec.max_matching_ngram_size, spec.max_concurrency) == (3, 5, 4)
    assert kw["cuda_graph_config"] is None and kw["enable_iter_perf_stats"] is True
    assert kw["guided_decoding_backend"] == "xgrammar" and "lora_config" not in kw
    assert kw["stream_interval"] == 4

    _, default = arguments(EngineConfig(model=str(model_dir), backend="trtllm"))
    assert default["scheduler_config"].capacity_scheduler_policy == api.CapacitySchedulerPolicy.MAX_UTILIZATION
    assert "cuda_graph_config" not in default and "speculative_config" not in default
    assert "stream_interval" not in default  # TensorRT-LLM's own default, 1


def test_engine_folder_takes_the_tensorrt_engine_class_and_needs_a_tokenizer(fake_trtllm, model_dir,
                                                                             tmp_path) -> None:
    """A trtllm-build output (config.json with pretrained_config + build_config): the TensorRT `LLM`, the
    tokenizer from --tokenizer (as Triton's tokenizer_dir), the engine's max_seq_len, no checkpoint-only knobs."""
    engine = engine_folder(tmp_path)
    config = EngineConfig(model=engine, backend="trtllm", lora_modules={})
    with pytest.raises(InvalidRequestError, match="name its tokenizer folder with --tokenizer"):
        arguments(config)
    cls, kw = arguments(config, tokenizer=str(model_dir))
    assert cls is load_api().TrtLLM
    assert (kw["model"], kw["tokenizer"], kw["max_seq_len"]) == (engine, str(model_dir), 96)
    assert "tokens_per_block" not in kw["kv_cache_config"].model_fields_set
    # TrtLlmArgs has no enable_iter_perf_stats; TensorRT-LLM refuses logprobs without gather_generation_logits
    assert "enable_iter_perf_stats" not in kw and "cuda_graph_config" not in kw
    assert kw["gather_generation_logits"] is True
    with pytest.raises(UnsupportedOptionError) as info:  # TrtLlmArgs has no stream_interval
        arguments(EngineConfig(model=engine, backend="trtllm", stream_interval=2), tokenizer=str(model_dir))
    assert info.value.param == "stream_interval"


@pytest.mark.parametrize("kind,extra,cls_name,on_engine", [
    ("Eagle", {"max_draft_len": 3, "speculative_model": "/eagle", "num_eagle_layers": 3}, "EagleDecodingConfig",
     False),
    ("Medusa", {"max_draft_len": 4, "num_medusa_heads": 4}, "MedusaDecodingConfig", True),
    ("Lookahead", {"max_window_size": 4, "max_ngram_size": 3, "max_verification_set_size": 4},
     "LookaheadDecodingConfig", True),
])
def test_extra_speculative_configs_pass_through(fake_trtllm, model_dir, tmp_path, kind, extra, cls_name,
                                                on_engine) -> None:
    model = engine_folder(tmp_path) if on_engine else str(model_dir)
    config = EngineConfig(model=model, backend="trtllm",
                          trtllm_extra={"speculative_config": {"decoding_type": kind, **extra},
                                        "kv_cache_config": {"host_cache_size": 1 << 20}})
    _, kw = arguments(config, tokenizer=str(model_dir))
    spec = kw["speculative_config"]
    assert type(spec) is getattr(load_api(), cls_name)
    assert {k: getattr(spec, k) for k in extra} == extra
    kv = kw["kv_cache_config"]  # a dict in trtllm_extra is merged over ours
    assert (kv.host_cache_size, kv.free_gpu_memory_fraction) == (1 << 20, 0.9)


def test_an_fp8_kv_cache_reaches_a_checkpoints_kv_cache_config_and_is_refused_for_an_engine(
        fake_trtllm, model_dir, tmp_path) -> None:
    _, kw = arguments(EngineConfig(model=str(model_dir), backend="trtllm", kv_cache_dtype="fp8"))
    assert kw["kv_cache_config"].dtype == "fp8"
    assert arguments(EngineConfig(model=str(model_dir), backend="trtllm"))[1]["kv_cache_config"].dtype == "auto"
    with pytest.raises(UnsupportedOptionError) as info:
        arguments(EngineConfig(model=engine_folder(tmp_path), backend="trtllm", kv_cache_dtype="fp8"),
                  tokenizer=str(model_dir))
    assert info.value.param == "kv_cache_dtype" and "set when it is built" in info.value.message


def test_speculation_the_folder_cannot_run_is_refused_at_start_up(fake_trtllm, model_dir, tmp_path) -> None:
    """TensorRT-LLM's DraftTarget and NGram configs support its PyTorch flow only, Medusa and Lookahead its
    TensorRT flow only (supports_backend): refused naming the option, before TensorRT-LLM starts."""
    engine = engine_folder(tmp_path)
    for speculative in ("draft", "ngram"):
        with pytest.raises(UnsupportedOptionError) as info:
            arguments(EngineConfig(model=engine, backend="trtllm", speculative=speculative, draft_model=str(model_dir),
                                   num_draft_tokens=3), tokenizer=str(model_dir))
        assert info.value.param == "speculative" and "PyTorch flow only" in info.value.message
    with pytest.raises(UnsupportedOptionError) as info:
        arguments(EngineConfig(model=str(model_dir), backend="trtllm", trtllm_extra={
            "speculative_config": {"decoding_type": "Medusa", "max_draft_len": 4}}))
    assert info.value.param == "trtllm_extra"
    assert "Medusa speculation does not run on a Hugging Face" in info.value.message


def test_one_three_line_config_lookups(fake_trtllm, monkeypatch, model_dir, tmp_path) -> None:
    """The 1.3 line no longer exports Medusa/Lookahead configs from tensorrt_llm.llmapi: they are taken from
    tensorrt_llm.llmapi.llm_args, and where neither has one the backend still starts and refuses only that."""
    import tensorrt_llm.llmapi as llmapi
    from tensorrt_llm.llmapi import llm_args

    for name in ("MedusaDecodingConfig", "LookaheadDecodingConfig"):
        monkeypatch.delattr(llmapi, name)
    api = load_api()
    assert (api.MedusaDecodingConfig, api.LookaheadDecodingConfig) == (llm_args.MedusaDecodingConfig,
                                                                       llm_args.LookaheadDecodingConfig)
    monkeypatch.delattr(llm_args, "MedusaDecodingConfig")
    api = load_api()
    assert api.MedusaDecodingConfig is None and api.EagleDecodingConfig is llmapi.EagleDecodingConfig
    config = EngineConfig(model=engine_folder(tmp_path), backend="trtllm",
                          trtllm_extra={"speculative_config": {"decoding_type": "Medusa", "max_draft_len": 4}})
    folder = ModelFolder.inspect(config.model, str(model_dir), None)
    with pytest.raises(UnsupportedOptionError, match="has no Medusa speculative decoding config"):
        llm_arguments(api, config, folder, TrtllmAdapters({}, 8))
    cls, _ = llm_arguments(api, EngineConfig(model=config.model, backend="trtllm"), folder, TrtllmAdapters({}, 8))
    assert cls is api.TrtLLM


def test_options_the_llm_api_cannot_take_are_refused_by_name(fake_trtllm, model_dir) -> None:
    base = dict(model=str(model_dir), backend="trtllm")
    for options, name in (({"device": "cpu"}, "device"), ({"device": "cuda:1"}, "device"),
                          ({"speculative": "ngram", "ngram_min": 2}, "ngram_min")):
        with pytest.raises(UnsupportedOptionError) as info:
            arguments(EngineConfig(**base, **options))
        assert info.value.param == name and "trtllm" in str(info.value)
    with pytest.raises(InvalidRequestError, match="decoding_type must be one of"):
        arguments(EngineConfig(**base, trtllm_extra={"speculative_config": {"decoding_type": "Magic"}}))
    with pytest.raises(InvalidRequestError, match="either --speculative or trtllm_extra.speculative_config"):
        arguments(EngineConfig(**base, speculative="ngram",
                               trtllm_extra={"speculative_config": {"decoding_type": "Medusa"}}))
