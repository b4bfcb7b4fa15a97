"""`trtllm-gateway serve`: every option documented with its env var; repeatable list flags; precedence."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli import build_parser, parse_serve_args
from gateway.settings import options

ROOT = Path(__file__).resolve().parents[2]


def serve_help() -> str:
    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    return " ".join(serve.format_help().split())  # argparse wraps lines; compare on single spaces


def test_every_option_is_documented_with_its_env_var() -> None:
    text = serve_help()
    for opt in options():
        assert opt.flag in text, opt.flag
        assert f"[env: {opt.env};" in text, opt.env
    assert len(options()) >= 40


def test_help_groups_are_titled_sections_and_no_help_is_the_option_name() -> None:
    """Groups come from `# section:` lines only: the prose comments beside the fields once became group titles
    ("serving, per number of decoding sequences, lost to this one on the H200 ..."), and options without a
    trailing comment got their own name as help ("num draft tokens")."""
    assert [*dict.fromkeys(opt.group for opt in options())] == [
        "server", "security", "request limits", "LoRA", "Responses API", "Triton", "model and engine",
        "batching and KV cache", "speculative decoding", "CPU execution", "GPU execution", "streaming",
        "TensorRT-LLM only"]
    for opt in options():
        assert opt.help.lower() != opt.name.replace("_", " ") and len(opt.help) > 12, opt.name
    assert "--cpu-compile" in serve_help().split("CPU execution:")[1].split("GPU execution:")[0]


def test_list_flags_repeat_and_take_several_values() -> None:
    s = parse_serve_args(["--api-key", "a", "--api-key", "b", "c", "--cors-origins", "https://x"], environ={})
    assert s.api_key == ["a", "b", "c"] and s.cors_origins == ["https://x"]


def test_env_vars_fill_options_and_flags_win() -> None:
    env = {"TRTLLM_GATEWAY_API_KEY": "k1, k2", "TRTLLM_GATEWAY_REQUEST_TIMEOUT": "2.5",
           "TRTLLM_GATEWAY_LOG_FORMAT": "json", "TRTLLM_GATEWAY_MAX_N": "4", "TRTLLM_GATEWAY_LOG_PROMPTS": "yes"}
    s = parse_serve_args([], environ=env)
    assert (s.api_key, s.request_timeout, s.log_format, s.max_n, s.log_prompts) == (["k1", "k2"], 2.5, "json", 4,
                                                                                     True)
    s = parse_serve_args(["--max-n", "8", "--request-timeout", "none", "--no-log-prompts"], environ=env)
    assert (s.max_n, s.request_timeout, s.log_prompts) == (8, None, False)


def test_defaults_keep_health_and_metrics_public_and_cors_off() -> None:
    s = parse_serve_args([], environ={})
    assert s.public_paths == ["/health", "/metrics", "/v2/health/live", "/v2/health/ready"]
    assert s.cors_origins == [] and s.api_key == []
    assert s.log_format == "text" and not s.log_prompts and s.request_timeout is None


def test_bad_env_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="TRTLLM_GATEWAY_MAX_N"):
        parse_serve_args([], environ={"TRTLLM_GATEWAY_MAX_N": "lots"})


@pytest.mark.parametrize("option", ["--stream-interval", "--max-batch-size", "--max-num-tokens", "--kv-block-size"])
def test_a_count_below_one_is_refused_before_anything_starts(option: str) -> None:
    """(--max-num-tokens 0 or -5 and --max-batch-size 0 were taken: the server started, and no request ever ran.)"""
    field = option.removeprefix("--").replace("-", "_")
    assert getattr(parse_serve_args([option, "4"], environ={}).engine, field) == 4
    for value in ("0", "-1"):
        with pytest.raises(ValueError, match=f"{option} must be at least 1, got {value}"):
            parse_serve_args([option, value], environ={})


def test_python_dash_m_gateway_prints_serve_help() -> None:
    out = subprocess.run([sys.executable, "-m", "gateway", "serve", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "--api-keys-file" in out.stdout and "TRTLLM_GATEWAY_DRAIN_TIMEOUT" in out.stdout


def test_missing_api_keys_file_is_one_clear_line(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "gateway", "serve", "--api-keys-file", str(tmp_path / "nope")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == (f"trtllm-gateway: error: --api-keys-file {tmp_path / 'nope'}: "
                                                   "No such file or directory")
