"""benchmarks/peer_cpu.py: sequential transformers generate, then our gateway (its own process) on the tiny model at
one concurrency; the transformers serve baseline left out (it needs transformers[serving], not installed here).
The load generator runs in this process (conftest.load_generator_here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import peer_cpu
from tests.benchmarks.smoke import positive

pytestmark = pytest.mark.benchmark_smoke


# the gateway it starts runs the engine in the gateway's process (TRTLLM_GATEWAY_ENGINE_PROCESS=false): the script runs
# the same, without a second torch process to start (3-4 s here); the engine-core process is served in tests/e2e
def test_generate_baseline_gateway_point_plot_and_section(tiny_model: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          load_generator_here: None) -> None:
    monkeypatch.setattr(peer_cpu, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(peer_cpu, "RESULTS_MD", tmp_path / "RESULTS.md")
    monkeypatch.setenv("TRTLLM_GATEWAY_ENGINE_PROCESS", "false")
    code = peer_cpu.main(["--model", str(tiny_model), "--concurrency", "2", "--dtypes", "float32",
                          "--no-transformers-serve", "--duration", "0.3", "--generate-prompts", "1",
                          "--input-tokens", "8", "--output-tokens", "4", "--append-results"])
    assert code == 0
    (js,), (png,) = tmp_path.glob("peer-cpu-*.json"), tmp_path.glob("peer-cpu-*.png")
    result = json.loads(js.read_text())
    point = result["points"]["ours float32"]["2"]
    assert (point["failed"], point["mean_output_tokens"]) == (0, 4.0)
    assert point["rounds_tok_s"] == [point["output_token_throughput"]]  # --rounds 1
    assert positive(result["generate_tok_s"], point["output_token_throughput"], point["ttft_ms"]["p50"])
    assert png.read_bytes()[:4] == b"\x89PNG"
    section = (tmp_path / "RESULTS.md").read_text()
    assert "| ours float32 | 2 |" in section and "x sequential generate" in section


def test_each_point_reports_its_median_round_and_every_round() -> None:
    rounds = [{"output_token_throughput": t, "round": i} for i, t in enumerate([120.0, 100.0, 110.0, 130.0])]
    assert peer_cpu._median_round(rounds) == {"output_token_throughput": 110.0, "round": 2,
                                              "rounds_tok_s": [120.0, 100.0, 110.0, 130.0]}


def test_llama_cpp_peer_commands_without_building(tmp_path: Path) -> None:
    """The llama.cpp peer's parts that need no build (building takes minutes: benchmarks/llama_cpp.py)."""
    from benchmarks.llama_cpp import LlamaCppTools, requantized, server_command

    tools = LlamaCppTools(tmp_path / "llama-server", tmp_path / "llama-quantize")
    bf16 = tmp_path / "model.BF16.gguf"
    assert requantized(tools, bf16, "BF16") == bf16  # already that type: served as it is
    cmd = server_command(tools, bf16, threads=2, slots=16, context=256)
    assert cmd[:3] == [str(tools.server), "-m", str(bf16)] and "{port}" in cmd
    assert cmd[cmd.index("-np") + 1] == "16" and cmd[cmd.index("-c") + 1] == str(16 * 256) and "-cb" in cmd
    # a quantized file is served unrepacked (its AMX repacking faults on the dev box); BF16 keeps ggml's default
    assert "--no-repack" not in cmd
    assert server_command(tools, tmp_path / "model.Q4_1.gguf", threads=2, slots=16)[-1] == "--no-repack"
    with pytest.raises(SystemExit, match="needs --model default or a .gguf file"):
        peer_cpu._gguf("some/folder")
