"""config.pbtxt reader and `--triton-model-repo` loading, on the backend's own template."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from string import Template

import pytest

from adapters.triton.model_repo import TritonRepoError, load_triton_repo
from adapters.triton.pbtxt import Enum, PbtxtError, Placeholder, first, model_parameters, parse_pbtxt
from runtime.config import EngineConfig

TEMPLATES = Path(__file__).parent / "triton_templates"

# The values of the backend README's quick start (tools/fill_template.py invocations).
QUICKSTART = {
    "triton_backend": "tensorrtllm",
    "triton_max_batch_size": "64",
    "decoupled_mode": "False",
    "max_beam_width": "1",
    "max_tokens_in_paged_kv_cache": "2560",
    "max_attention_window_size": "2560",
    "kv_cache_free_gpu_mem_fraction": "0.5",
    "exclude_input_in_output": "True",
    "enable_kv_cache_reuse": "False",
    "batching_strategy": "inflight_fused_batching",
    "max_queue_delay_microseconds": "0",
    "batch_scheduler_policy": "guaranteed_no_evict",
    "enable_chunked_context": "true",
}


def fill(template: str, values: dict[str, str]) -> str:
    """What tools/fill_template.py does: safe substitution, with its two defaults."""
    return Template(template).safe_substitute({"max_queue_size": 0, "max_queue_delay_microseconds": 0, **values})


def make_repo(tmp_path: Path, values: dict[str, str] | None, preprocessing: dict[str, str] | None = None) -> Path:
    repo = tmp_path / "triton_model_repo"
    for model, name in (("tensorrt_llm", "tensorrt_llm_config.pbtxt"), ("preprocessing", "preprocessing_config.pbtxt")):
        (repo / model / "1").mkdir(parents=True)
        text = (TEMPLATES / name).read_text()
        vals = values if model == "tensorrt_llm" else preprocessing
        (repo / model / "config.pbtxt").write_text(text if vals is None else fill(text, vals))
    return repo


# -- the parser ---------------------------------------------------------------------------------


def test_parses_the_backend_template_structure() -> None:
    msg = parse_pbtxt((TEMPLATES / "tensorrt_llm_config.pbtxt").read_text())
    assert first(msg, "name") == "tensorrt_llm"
    assert first(msg, "max_batch_size") == Placeholder("triton_max_batch_size")
    assert first(first(msg, "model_transaction_policy"), "decoupled") == Placeholder("decoupled_mode")
    inputs = msg["input"]
    assert [first(i, "name") for i in inputs] == ["input_ids", "input_lengths", "request_output_len", "runtime_top_k"]
    assert inputs[0]["dims"] == [-1] and first(inputs[0], "data_type") == Enum("TYPE_INT32")
    assert first(inputs[0], "allow_ragged_batch") is True
    assert first(inputs[1], "reshape") == {"shape": []}
    assert msg["output"][0]["dims"] == [-1, -1]
    assert first(msg["instance_group"][0], "kind") == "KIND_CPU"
    params = model_parameters(msg)
    assert len(params) == 45
    assert params["gpt_model_path"] == "${engine_dir}"
    assert params["executor_worker_path"] == "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"


def test_scalars_strings_and_lists() -> None:
    msg = parse_pbtxt(
        """
        a: 1  b: -2.5 c: 1e3 d: 0x1F e: true f: False   # comment
        s: "x\\"y\\n" 'z'   # adjacent strings join
        u: "\\303\\251"     # octal UTF-8 bytes
        l: [1, 2, 3] l: 4
        m < k: "v" >
        n { }
        e2: [ ]
        """
    )
    assert msg["a"] == [1] and msg["b"] == [-2.5] and msg["c"] == [1000.0] and msg["d"] == [31]
    assert msg["e"] == [True] and msg["f"] == [False]
    assert msg["s"] == ['x"y\nz']
    assert msg["u"] == ["é"]
    assert msg["l"] == [1, 2, 3, 4]
    assert msg["m"] == [{"k": ["v"]}] and msg["n"] == [{}] and msg["e2"] == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: 1\nb: {\n c: 2\n", "line 3: unexpected end of file"),
        ("a: 1\n\n  : 2", "line 3: expected a field name"),
        ("a: [1 2]", "line 1: expected ',' or ']'"),
        ("a: 1\nb: @", "line 2: unexpected character '@'"),
        ('a: "\\q"', "line 1: unknown escape"),
    ],
)
def test_syntax_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(PbtxtError, match=message):
        parse_pbtxt(text)


# -- the model repository -------------------------------------------------------------------------


def test_filled_template_maps_onto_engine_fields(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, {**QUICKSTART, "engine_dir": "/engines/llama"}, {"tokenizer_dir": "/tok"})
    settings = load_triton_repo(str(repo))
    assert settings.engine == {
        "model": "/engines/llama",
        "tokenizer": "/tok",
        "max_beam_width": 1,
        "max_kv_tokens": 2560,
        "scheduler_policy": "guaranteed_no_evict",
        "kv_cache_fraction": 0.5,
        "enable_prefix_caching": False,
        "enable_chunked_prefill": True,
        "max_batch_size": 64,
    }
    assert settings.tokenizer_dir == "/tok"
    assert settings.exclude_input_in_output is True
    # the only filled parameter we cannot honour; everything else filled is mapped or has no effect
    assert settings.unsupported == ["max_attention_window_size=2560"]
    assert "lora_prefetch_dir" in settings.unfilled and "engine_dir" not in settings.unfilled
    assert settings.warning.count("\n") == 0
    assert "ignoring parameters this gateway does not support: max_attention_window_size=2560" in settings.warning
    config = settings.apply(EngineConfig(max_batch_size=8, seed=3), cli_fields={"max_batch_size"})
    assert config.max_batch_size == 8 and config.seed == 3 and config.model == "/engines/llama"
    assert config.kv_cache_fraction == 0.5 and config.enable_prefix_caching is False


def test_unfilled_template_is_an_error_naming_the_values(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, None)
    with pytest.raises(TritonRepoError) as info:
        load_triton_repo(str(repo))
    message = str(info.value)
    for name in ("triton_max_batch_size", "decoupled_mode", "max_queue_delay_microseconds", "max_queue_size",
                 "gpt_model_path (${engine_dir})"):
        assert name in message
    assert "fill_template.py" in message


def test_flags_stand_in_for_unfilled_required_values(tmp_path: Path) -> None:
    values = {k: v for k, v in QUICKSTART.items() if k != "triton_max_batch_size"}
    repo = make_repo(tmp_path, values)
    with pytest.raises(TritonRepoError, match="triton_max_batch_size, gpt_model_path"):
        load_triton_repo(str(repo))
    settings = load_triton_repo(str(repo), cli_fields={"max_batch_size", "model"})
    assert "max_batch_size" not in settings.engine and "model" not in settings.engine
    assert settings.tokenizer_dir is None  # preprocessing's tokenizer_dir left unfilled: the model's own


def test_bad_parameter_values_are_errors(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, {**QUICKSTART, "engine_dir": "/e", "kv_cache_free_gpu_mem_fraction": "1.5",
                                "batch_scheduler_policy": "fifo"})
    with pytest.raises(TritonRepoError) as info:
        load_triton_repo(str(repo))
    assert "kv_cache_free_gpu_mem_fraction: expected a fraction in (0, 1], got '1.5'" in str(info.value)
    assert "batch_scheduler_policy: expected max_utilization or guaranteed_no_evict, got 'fifo'" in str(info.value)


def test_speculative_and_multi_gpu_values_are_reported(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, {**QUICKSTART, "engine_dir": "/e", "decoding_mode": "medusa",
                                "gpu_device_ids": "0,1", "batching_strategy": "V1", "max_queue_size": "7"})
    settings = load_triton_repo(str(repo))
    assert set(settings.unsupported) == {"max_attention_window_size=2560", "decoding_mode=medusa",
                                         "gpu_device_ids=0,1", "gpt_model_type=V1"}
    assert settings.engine["max_queue_size"] == 7
    single = load_triton_repo(str(make_repo(tmp_path / "b", {**QUICKSTART, "engine_dir": "/e", "gpu_device_ids": "1"})))
    assert single.engine["device"] == "cuda:1"


def test_lora_host_cache_bytes_become_an_adapter_count(tmp_path: Path) -> None:
    model = tmp_path / "ckpt"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                                   "num_key_value_heads": 2, "intermediate_size": 128}))
    # rank 8: per layer q(64+64) k,v 2*(64+32) o(64+64) gate,up 2*(64+128) down(128+64) = 1024 -> 8*1024*2*2 bytes
    repo = make_repo(tmp_path, {**QUICKSTART, "engine_dir": str(model), "lora_cache_optimal_adapter_size": "8",
                                "lora_cache_host_memory_bytes": str(32768 * 10 + 5), "lora_cache_max_adapter_size": "32"})
    settings = load_triton_repo(str(repo))
    assert settings.engine["max_cpu_loras"] == 10
    assert settings.engine["max_lora_rank"] == 32


def test_repo_without_the_backend_model(tmp_path: Path) -> None:
    with pytest.raises(TritonRepoError, match="no tensorrt_llm/config.pbtxt"):
        load_triton_repo(str(tmp_path))
    # a renamed model folder is found by its backend
    repo = make_repo(tmp_path, {**QUICKSTART, "engine_dir": "/e"})
    shutil.move(str(repo / "tensorrt_llm"), str(repo / "llm"))
    assert load_triton_repo(str(repo)).engine["model"] == "/e"
