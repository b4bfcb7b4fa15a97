"""The CPU's "auto" settings (runtime/native/cpu/defaults.py): what a checkpoint and a CPU give, and the one line that says
so at start-up, for GGUF files served with no options."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from runtime.native.cpu.defaults import CpuFeatures, cpu_dtype, cpu_quantization, source_quantization
from runtime.native.cpu.native_decode import NativeDecode
from tests.engine_harness import collect, request, running_engine
from tests.tiny_models import build_tiny_model
from tests.unit.test_gguf import TINY_GGUF_SHAPE, write_gguf

BF16_CPU, PLAIN_CPU = CpuFeatures(frozenset({"avx512f", "avx512_bf16", "avx2"})), CpuFeatures(frozenset({"avx2"}))


@pytest.mark.parametrize(("types", "expected"), [(["Q4_1"], "int4"), (["Q4_0", "Q4_K"], "int4"),
                                                 (["Q4_1", "Q6_K"], "int8"), (["Q8_0"], "int8"), (["F16"], "none"),
                                                 ([], "none")])
def test_source_quantization_keeps_what_the_blocks_hold(types: list[str], expected: str) -> None:
    assert source_quantization({"gguf_layer_types": types} if types else {}) == expected


def test_bf16_activations_only_for_quantized_checkpoints_on_a_cpu_that_multiplies_bf16() -> None:
    assert cpu_dtype("auto", torch.float32, "int4", BF16_CPU) == torch.bfloat16
    assert cpu_dtype("auto", torch.float32, "int4", PLAIN_CPU) == torch.float32
    assert cpu_dtype("auto", torch.float32, "none", BF16_CPU) == torch.float32  # a float32 checkpoint keeps its values
    assert cpu_dtype("float32", torch.float32, "int4", BF16_CPU) == torch.float32  # asked for: as given
    assert cpu_quantization("auto", "int4") == "int4" and cpu_quantization("none", "int4") == "none"


@pytest.mark.parametrize(("qtype", "weights", "steps"), [("Q4_1", "int4 weight-only", "C++ decode steps"),
                                                          ("Q8_0", "int8 weight-only", "eager steps"),
                                                          ("F32", "no weight-only quantization", "eager steps")])
async def test_a_gguf_file_with_no_options_serves_at_its_settings_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, qtype: str, weights: str,
        steps: str) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = write_gguf(build_tiny_model(tmp_path / "models", "llama", **TINY_GGUF_SHAPE), tmp_path / "tiny.gguf", qtype)
    quantized = qtype != "F32" and CpuFeatures.detect().bf16_products
    with caplog.at_level(logging.INFO, logger="runtime.native.cpu.defaults"):
        # the harness's float32 / unquantized defaults put back to "auto"; compiled steps (the C++ one) allowed, as
        # a server allows them, with torch.compile's left out (eager steps stand for them here)
        async with running_engine(path, dtype="auto", cpu_quantization="auto", cpu_compile=qtype == "Q4_1") as engine:
            out = await collect(engine, request("a", [5, 9, 17], max_tokens=6))
            assert isinstance(engine.runner.graphs, NativeDecode) == (steps == "C++ decode steps")
    assert len(out.tokens[0]) == 6
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("CPU settings:")]
    dtype = "bfloat16" if quantized else "float32"
    assert line.startswith(f"CPU settings: {dtype} activations, {weights}, ") and f", {steps} (the CPU has " in line
