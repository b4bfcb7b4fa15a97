"""`trtllm-gateway serve --triton-model-repo DIR`: the backend's template parameters become settings."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gateway.cli import parse_serve_args
from tests.unit.test_triton_pbtxt import QUICKSTART, make_repo


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path, {**QUICKSTART, "engine_dir": "/engines/llama"}, {"tokenizer_dir": "/tok"})


def test_repository_parameters_become_settings(repo: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway.cli"):
        settings = parse_serve_args(["--triton-model-repo", str(repo)], environ={})
    e = settings.engine
    assert (e.model, e.tokenizer, e.scheduler_policy) == ("/engines/llama", "/tok", "guaranteed_no_evict")
    assert (e.max_batch_size, e.max_kv_tokens, e.kv_cache_fraction, e.max_beam_width) == (64, 2560, 0.5, 1)
    assert (e.enable_prefix_caching, e.enable_chunked_prefill) == (False, True)
    assert settings.exclude_input_in_output is True
    assert settings.triton_model_repo == str(repo)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "max_attention_window_size=2560" in warnings[0]


def test_flags_and_environment_override_the_files(repo: Path) -> None:
    settings = parse_serve_args(
        ["--triton-model-repo", str(repo), "--max-batch-size", "3", "--no-exclude-input-in-output",
         "--scheduler-policy", "max_utilization"],
        environ={"TRTLLM_GATEWAY_KV_CACHE_FRACTION": "0.7"},
    )
    e = settings.engine
    assert (e.max_batch_size, e.scheduler_policy, e.kv_cache_fraction) == (3, "max_utilization", 0.7)
    assert settings.exclude_input_in_output is False
    assert e.max_kv_tokens == 2560  # not overridden: still the file's


def test_unfilled_required_values_are_an_error_naming_them(tmp_path: Path) -> None:
    values = {k: v for k, v in QUICKSTART.items() if k != "triton_max_batch_size"}  # and no engine_dir
    repo = make_repo(tmp_path, values)
    with pytest.raises(ValueError, match=r"unfilled template values: triton_max_batch_size, gpt_model_path"):
        parse_serve_args(["--triton-model-repo", str(repo)], environ={})
    # flags can stand in for the values the file lacks
    settings = parse_serve_args(["--triton-model-repo", str(repo), "--model", "/m", "--max-batch-size", "2"],
                                environ={})
    assert (settings.engine.model, settings.engine.max_batch_size) == ("/m", 2)
    assert settings.engine.scheduler_policy == "guaranteed_no_evict"


def test_without_a_repository_nothing_changes() -> None:
    settings = parse_serve_args([], environ={})
    assert settings.triton_model_repo is None and settings.exclude_input_in_output is False
    assert settings.metrics_port is None
