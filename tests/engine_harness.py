"""Helpers for tests that drive NativeEngine directly: start/stop, collect outputs, record steps, HF references.

    async with running_engine(checkpoint, max_kv_tokens=512) as engine:
        out = await collect(engine, request("a", prompt, max_tokens=8))
        assert out.tokens[0] == hf_greedy(hf_model, prompt, 8)

`StepRecorder` wraps the engine's scheduler so a test can see what every step ran (prefill chunks,
decodes, forks, preemptions) without timing assumptions.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from runtime.config import EngineConfig
from runtime.engine import EngineStats
from runtime.native.llm_engine import NativeEngine
from runtime.request import GenerationRequest, OutputDelta, SamplingOptions, Usage


@asynccontextmanager
async def running_engine(checkpoint: Path, **config: Any) -> AsyncIterator[NativeEngine]:
    """A started NativeEngine over `checkpoint` (EngineConfig fields as keywords; float32 without weight-only
    quantization unless `dtype` / `cpu_quantization` is given: "auto" would quantize a GGUF file's), on the CPU,
    or on the device ENGINE_TEST_DEVICE names (the GPU check runs the engine tests with ENGINE_TEST_DEVICE=cuda:
    CUDA graphs, Triton kernels, against the same CPU references)."""
    config.setdefault("kv_block_size", 4)
    config.setdefault("max_kv_tokens", 1024)
    config.setdefault("device", os.environ.get("ENGINE_TEST_DEVICE", "cpu"))
    # speculation tests batch many sequences on purpose, and speculate wherever they may: the product stops above 2,
    # and where its guard measures plain steps faster, which depends on the machine (EngineConfig)
    config.setdefault("speculative_max_concurrency", None)
    config.setdefault("speculative_guard", False)
    config.setdefault("dtype", "float32")
    config.setdefault("cpu_quantization", "none")
    engine = NativeEngine(EngineConfig(model=str(checkpoint), **config))
    await engine.start()
    await engine.warmed_up()  # with cpu_compile: the kernel and compiled steps, built while eager steps serve
    try:
        yield engine
    finally:
        await engine.shutdown()


def request(request_id: str, prompt: list[int], max_tokens: int, **sampling: Any) -> GenerationRequest:
    """A token-id request; greedy and ignoring eos unless told otherwise (full-length comparisons)."""
    sampling.setdefault("temperature", 0.0)
    sampling.setdefault("ignore_eos", True)
    return GenerationRequest(request_id, prompt_token_ids=list(prompt),
                             sampling=SamplingOptions(max_tokens=max_tokens, **sampling))


@dataclass
class Collected:
    """Everything one request yielded, grouped by sequence index."""

    deltas: list[OutputDelta] = field(default_factory=list)
    tokens: dict[int, list[int]] = field(default_factory=dict)
    text: dict[int, str] = field(default_factory=dict)
    finish: dict[int, str | None] = field(default_factory=dict)
    stop_reason: dict[int, str | int | None] = field(default_factory=dict)
    cumulative_logprob: dict[int, float | None] = field(default_factory=dict)
    usage: Usage | None = None

    def add(self, d: OutputDelta) -> None:
        self.deltas.append(d)
        self.tokens.setdefault(d.index, []).extend(d.token_ids)
        self.text[d.index] = self.text.get(d.index, "") + d.text
        if d.finish_reason is not None:
            self.finish[d.index] = d.finish_reason
            self.stop_reason[d.index] = d.stop_reason
            self.cumulative_logprob[d.index] = d.cumulative_logprob
        if d.usage is not None:
            self.usage = d.usage


async def collect(engine: NativeEngine, req: GenerationRequest, *, started: asyncio.Event | None = None,
                  after_tokens: int = 1) -> Collected:
    """Run `req` to the end; set `started` once it has produced `after_tokens` tokens."""
    out = Collected()
    async for d in engine.generate(req):
        out.add(d)
        if started is not None and sum(map(len, out.tokens.values())) >= after_tokens:
            started.set()
    if started is not None:
        started.set()
    return out


async def wait_for(predicate: Any, timeout: float = 10.0) -> None:
    """Poll `predicate()` (engine stats settle one step after the outputs) until true."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


@dataclass
class StepEntry:
    request_id: str
    index: int
    num_new_tokens: int
    is_prefill: bool
    start: int  # tokens already computed before the step
    block_table: list[int]


class StepRecorder:
    """Records every non-empty step the engine's scheduler produced (runs in the engine thread)."""

    def __init__(self, engine: NativeEngine) -> None:
        self.steps: list[list[StepEntry]] = []
        self.used_blocks: list[int] = []  # KV blocks in use after each step's allocation
        self.stats: list[EngineStats] = []  # engine.stats() after each step (aligned with `steps`)
        scheduler = engine.scheduler
        inner = scheduler.schedule
        step = engine.step

        def schedule() -> Any:
            batch = inner()
            if batch:
                self.steps.append([
                    StepEntry(e.seq.request_id, e.seq.index, e.num_new_tokens, e.is_prefill,
                              e.seq.num_computed_tokens, list(e.seq.block_table))
                    for e in batch.entries
                ])
                self.used_blocks.append(scheduler.block_manager.num_used_blocks)
            return batch

        def recorded_step() -> int:
            ran = step()
            if ran:
                self.stats.append(engine.stats())
            return ran

        scheduler.schedule = schedule  # type: ignore[method-assign]
        engine.step = recorded_step  # type: ignore[method-assign]

    def of(self, request_id: str) -> list[tuple[int, StepEntry]]:
        """(step number, entry) of every step that ran `request_id`."""
        return [(i, e) for i, step in enumerate(self.steps) for e in step if e.request_id == request_id]

    def prefill_tokens(self, request_id: str) -> int:
        return sum(e.num_new_tokens for _, e in self.of(request_id) if e.is_prefill)


# continuations per model, (prompt, max_new_tokens) -> ids, held weakly: a freed model's go with it (keyed by id(model)
# they outlived it, and a model loaded where a freed one had lived read that one's ids)
_HF_CACHE: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple[tuple[int, ...], int], list[int]]] = (
    weakref.WeakKeyDictionary())


def hf_greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy `generate` continuation of `prompt` (eos disabled; cached per model and prompt)."""
    cached, key = _HF_CACHE.setdefault(model, {}), (tuple(prompt), max_new_tokens)
    if key not in cached:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False)
        cached[key] = out[0, len(prompt):].tolist()
    return cached[key]


def hf_greedy_fp8(model: torch.nn.Module, prompt: list[int], max_new_tokens: int,
                  scales: list[tuple[float, float]] | None = None) -> list[int]:
    """hf_greedy over a cache that stores each key and value as saturate(x / scale) in E4M3 and reads it back times
    the scale (--kv-cache-dtype fp8's reference): `scales` (k_scale, v_scale) per layer, None: 1."""
    from transformers import DynamicCache  # (imported here: a second and more for every test module otherwise)

    class Fp8RoundingCache(DynamicCache):
        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,  # type: ignore[override]
                   *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
            k_scale, v_scale = (1.0, 1.0) if scales is None else scales[layer_idx]
            return super().update(_e4m3(key_states, k_scale), _e4m3(value_states, v_scale), layer_idx, *args,
                                  **kwargs)

    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                             past_key_values=Fp8RoundingCache(config=model.config))
    return out[0, len(prompt):].tolist()


def _e4m3(t: torch.Tensor, scale: float) -> torch.Tensor:
    return (t / scale).to(torch.float8_e4m3fn).to(t.dtype) * scale


def load_hf(checkpoint: Path) -> torch.nn.Module:
    """The same checkpoint through transformers, with eos disabled so greedy runs go the full length."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    return model
