"""runtime/native/cpu/compiled_decode.py: single-stream decode steps compiled with torch.compile give the eager tokens."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from runtime.config import EngineConfig
from runtime.native.cpu.compiled_decode import CompiledDecode
from runtime.native.cpu.native_decode import NativeDecode
from runtime.native.llm_engine import NativeEngine
from runtime.native.model_runner import ModelRunner
from tests.engine_harness import collect, hf_greedy, load_hf, request, running_engine, wait_for
from tests.tiny_models import build_tiny_model

pytestmark = pytest.mark.long_file  # (tests/conftest.py schedules it first)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("compiled_decode"), "llama")


async def _greedy(checkpoint: Path, **config: object) -> tuple[list[list[int]], bool]:
    """One stream (compiled steps), then three at once (eager steps of three rows, or C++ ones) across block
    boundaries; and whether the compiled path (the C++ step for int4 Llama models) served the single stream."""
    async with running_engine(checkpoint, kv_block_size=4, **config) as engine:
        graphs = engine.runner.graphs
        alone = (await collect(engine, request("alone", [5, 9, 17], max_tokens=14))).tokens[0]
        compiled = (isinstance(graphs, CompiledDecode) and graphs.row_counts == (1,)) or isinstance(graphs, NativeDecode)
        together = await asyncio.gather(*(collect(engine, request(f"r{n}", list(range(3, 3 + n)), max_tokens=9))
                                          for n in (2, 6, 11)))
    return [alone] + [out.tokens[0] for out in together], compiled


@pytest.mark.parametrize(("dtype", "quantization"), [("float32", "int4"), ("bfloat16", "int4"), ("float32", "int8")])
async def test_compiled_steps_decode_the_eager_tokens(checkpoint: Path, dtype: str, quantization: str) -> None:
    compiled, used = await _greedy(checkpoint, dtype=dtype, cpu_compile=True, cpu_quantization=quantization)
    eager, _ = await _greedy(checkpoint, dtype=dtype, cpu_compile=False, cpu_quantization=quantization)
    assert used, "the single stream did not run compiled steps"
    assert compiled == eager


async def test_compiled_float32_steps_match_transformers(checkpoint: Path) -> None:
    tokens, used = await _greedy(checkpoint, dtype="float32", cpu_compile=True)
    assert used
    assert tokens[0] == hf_greedy(load_hf(checkpoint), [5, 9, 17], 14)



async def test_a_draft_model_speculates_beside_compiled_steps(checkpoint: Path) -> None:
    """The draft's own runner stays eager on CPU (it once tried to capture CUDA graphs whenever the target had
    compiled steps), and speculation stays exact. (The target's compiled step is the float32 test's above, which a
    process compiles once: each engine's tokens are transformers' too.)"""
    outputs = {}
    for mode in ("none", "draft"):
        draft = {"draft_model": str(checkpoint)} if mode == "draft" else {}
        async with running_engine(checkpoint, cpu_compile=True, speculative=mode, **draft) as engine:
            assert isinstance(engine.runner.graphs, CompiledDecode)
            outputs[mode] = (await collect(engine, request(mode, [5, 9, 17], max_tokens=16))).tokens[0]
            stats = engine.stats()
    assert outputs["draft"] == outputs["none"] == hf_greedy(load_hf(checkpoint), [5, 9, 17], 16)
    assert stats.spec_accepted_tokens > 0


async def test_eager_steps_serve_while_the_compiled_steps_build(checkpoint: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine serves before its compiled steps exist (a warm restart of the default model waited 75 s for them):
    eager steps serve meanwhile, its phase says what it builds, then the compiled steps take over, same tokens."""
    gate = threading.Event()
    compile_decode = ModelRunner.compile_decode
    monkeypatch.setattr(ModelRunner, "compile_decode",
                        lambda runner, *args: (gate.wait(120), compile_decode(runner, *args))[1])
    engine = NativeEngine(EngineConfig(model=str(checkpoint), device="cpu", dtype="float32", kv_block_size=4,
                                       max_kv_tokens=1024, cpu_compile=True))
    await engine.start()
    try:
        assert engine.ready and engine.runner.graphs is None
        await wait_for(lambda: engine.phase == "compiling one-stream decode steps")
        eager = (await collect(engine, request("eager", [5, 9, 17], max_tokens=14))).tokens[0]
        assert engine.runner.graphs is None and engine.phase == "compiling one-stream decode steps"
        gate.set()
        await asyncio.wait_for(engine.warmed_up(), 300)
        assert isinstance(engine.runner.graphs, CompiledDecode)
        steps = engine.runner.eager_steps
        compiled = (await collect(engine, request("compiled", [5, 9, 17], max_tokens=14))).tokens[0]
        assert compiled == eager and engine.runner.eager_steps == steps + 1  # the prompt's step alone ran eagerly
    finally:
        gate.set()
        await engine.shutdown()



async def _many_rows(checkpoint: Path, rows: int) -> list[list[int]]:
    """Greedy tokens of `rows` requests decoding together in C++ steps (bfloat16, int4)."""
    async with running_engine(checkpoint, kv_block_size=4, max_batch_size=rows, dtype="bfloat16",
                              cpu_quantization="int4", cpu_compile=True) as engine:
        assert isinstance(engine.runner.graphs, NativeDecode)
        outs = await asyncio.gather(*(collect(engine, request(f"m{i}", [3 + i % 50, 7 + i % 13], max_tokens=4))
                                      for i in range(rows)))
    return [out.tokens[0] for out in outs]


_MANY_ROWS = """
import asyncio, json, os, sys
from pathlib import Path
if sys.argv[2] == "one core":  # before the C++ kernels count the cores they may use
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
from tests.unit.test_compiled_decode import _many_rows
print(json.dumps(asyncio.run(_many_rows(Path(sys.argv[1]), 160))))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the helper threads need a second core")
def test_a_c_plus_plus_step_spread_over_cores_gives_the_tokens_of_one_core(checkpoint: Path) -> None:
    """160 rows: enough per-row work that the C++ step hands its norms, RoPE and SiLU (and its products) to the
    helper threads of spread.cpp; a process held to one core runs all of it on the calling thread."""
    def tokens(cores: str) -> list[list[int]]:
        done = subprocess.run([sys.executable, "-c", _MANY_ROWS, str(checkpoint), cores], capture_output=True,
                              text=True, cwd=ROOT, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.splitlines()[-1])

    assert tokens("all cores") == tokens("one core")
