"""Test helpers: put the fake `tensorrt_llm` (tests/fakes/tensorrt_llm) on sys.path, or hide it; drive a
TrtllmEngine over it.

`fake_trtllm` yields the imported fake package and removes every `tensorrt_llm*` module afterwards, so
a later test that expects TensorRT-LLM to be missing sees it missing.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from runtime.config import EngineConfig
from runtime.request import GenerationRequest, OutputDelta

FAKES = Path(__file__).resolve().parent
SNAPSHOT = FAKES / "trtllm_api_snapshot.json"


def load_snapshot() -> dict[str, Any]:
    with open(SNAPSHOT, encoding="utf-8") as f:
        return json.load(f)


def _purge() -> None:
    for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        del sys.modules[name]


@pytest.fixture
def fake_trtllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The fake tensorrt_llm, importable for the duration of one test."""
    _purge()
    monkeypatch.syspath_prepend(str(FAKES))
    import tensorrt_llm

    yield tensorrt_llm
    _purge()


def engine_folder(root: Path, **build: Any) -> str:
    """A trtllm-build output folder, config.json only (pretrained_config + build_config, with `build` over
    max_seq_len 96 and max_batch_size 8): the fake's TensorRT-engine LLM accepts its requests, never runs them."""
    folder = root / "engine"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "pretrained_config": {"architecture": "LlamaForCausalLM", "vocab_size": 300, "dtype": "float16"},
        "build_config": {"max_seq_len": 96, "max_batch_size": 8, **build}}))
    return str(folder)


def make_config(model_dir: Path | str, **kw: Any) -> EngineConfig:
    return EngineConfig(**{"model": str(model_dir), "backend": "trtllm", "max_batch_size": 4,
                           "max_kv_tokens": 1024, "kv_block_size": 16, **kw})


@asynccontextmanager
async def running(config: EngineConfig) -> AsyncIterator[Any]:
    """A started TrtllmEngine, shut down on the way out."""
    from runtime.trtllm.engine import TrtllmEngine

    engine = TrtllmEngine(config)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.shutdown()


def recording(engine: Any) -> list[dict[str, Any]]:
    """Record every generate_async call's arguments (the SamplingParams, the LoRARequest) and its result."""
    calls: list[dict[str, Any]] = []
    real = engine.llm.generate_async

    def spy(inputs, **kwargs):
        calls.append({"inputs": inputs, **kwargs})
        calls[-1]["result"] = real(inputs, **kwargs)
        return calls[-1]["result"]

    engine.llm.generate_async = spy
    return calls


async def drained(engine: Any) -> bool:
    """True once the fake LLM's runtime holds no request (aborts take effect at its next iteration)."""
    for _ in range(200):
        if not engine.llm._executor._engine.has_work:
            return True
        await asyncio.sleep(0.01)
    return False


async def collect(engine: Any, request: GenerationRequest) -> list[OutputDelta]:
    return [d async for d in engine.generate(request)]
