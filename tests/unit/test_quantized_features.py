"""LoRA, one-step-ahead scheduling, speculation (n-gram, and a draft that is the same quantized checkpoint), guided
decoding and the CPU's C++ decode step on quantized models, through the engine (issue 44, item 5).

For each quantized form, a reference engine (the adapter loaded; no speculation, synchronous) and two engines with
every feature at once give the same greedy ids for a base request, an adapter request and a regex-guided request.
Where the CPU serves a checkpoint's dequantized float weights exactly (FP8 checkpoints, AWQ grids under
--cpu-quantization int4) the reference itself equals transformers (+ PEFT) on the dequantized model."""

from __future__ import annotations

import asyncio
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from runtime.native.cpu.native_decode import NativeDecode
from runtime.native.llm_engine import NativeEngine
from runtime.request import GenerationRequest, GuidedDecoding, SamplingOptions
from tests.engine_harness import collect, hf_greedy, load_hf, request, running_engine
from tests.fp8_checkpoints import write_fp8_checkpoint
from tests.int4_checkpoints import write_int4_checkpoint
from tests.lora_adapters import make_peft_adapter, peft_greedy
from tests.tiny_models import build_tiny_model

# most ids of the vocabulary, so that the n-gram proposer finds most generated tokens in the context and proposes
PROMPTS = [random.Random(0).sample(range(3, 300), 200), [7, 7, 90, 200, 11, 64, 3, 150, 42]]
TOKENS = 24  # with every draft accepted (3 tokens a step) the base rows outlast the adapted one by 6 steps
ADAPTED_TOKENS = 6  # then the base rows decode without it: steps with an adapter row run eagerly, the others in C++
REGEX = r"(yes|no)-[0-9]{2}"
DEVICE = os.environ.get("ENGINE_TEST_DEVICE", "cpu")  # as tests/engine_harness.py runs engines


@dataclass(frozen=True)
class Case:
    """A quantized form: which checkpoint (`source`: the 16-bit one; `fp8`, `awq`: written from it) under which
    flags; `together`: its requests may share steps (int8 serves steps of up to 4 rows only: docs/quantization.md)."""

    checkpoint: str
    flags: dict[str, Any] = field(default_factory=dict)
    together: bool = True
    cpp_steps: bool = False  # the C++ decode step serves its base rows


CASES = {
    "fp8-checkpoint": Case("fp8"),
    "awq-cpu-int4-cpp-steps": Case("awq", {"cpu_quantization": "int4", "cpu_compile": True}, cpp_steps=True),
    "quantization-fp8-kv-fp8": Case("source", {"quantization": "fp8", "kv_cache_dtype": "fp8"}),
    "cpu-int8": Case("source", {"cpu_quantization": "int8"}, together=False),
    "cpu-int4-kv-fp8": Case("source", {"cpu_quantization": "int4", "kv_cache_dtype": "fp8"}),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("quantized_features")
    source = build_tiny_model(root, "llama-untied")
    fp8, fp8_plain = write_fp8_checkpoint(source, root, "compressed-tensors")
    awq, awq_plain = write_int4_checkpoint(source, root, "awq")
    adapter = make_peft_adapter(source, root / "adapter", ["q_proj", "v_proj", "down_proj"], r=4, seed=1)
    return {"source": source, "fp8": fp8, "fp8-plain": fp8_plain, "awq": awq, "awq-plain": awq_plain,
            "adapter": adapter}


def _requests() -> list[GenerationRequest]:
    """A base request, one with the adapter, one guided by REGEX, and the adapted prompt without the adapter."""
    adapted, unadapted = (request(rid, PROMPTS[1], ADAPTED_TOKENS) for rid in ("adapted", "unadapted"))
    adapted.adapter = "a"
    guided = GenerationRequest("guided", prompt_token_ids=PROMPTS[0], guided=GuidedDecoding(regex=REGEX),
                               sampling=SamplingOptions(max_tokens=TOKENS, temperature=0.0))
    return [request("base", PROMPTS[0], TOKENS), adapted, guided, unadapted]


async def _serve(checkpoint: Path, together: bool, **config: Any) -> tuple[list[list[int]], list[str], NativeEngine]:
    """Ids and texts of _requests(), and the stopped engine."""
    async with running_engine(checkpoint, **config) as engine:
        if together:
            outs = await asyncio.gather(*(collect(engine, r) for r in _requests()))
        else:
            outs = [await collect(engine, r) for r in _requests()]
    return [o.tokens[0] for o in outs], [o.text[0] for o in outs], engine


@pytest.mark.parametrize("name", CASES)
async def test_features_on_a_quantized_model_give_the_reference_ids(models: dict[str, Path], name: str) -> None:
    case = CASES[name]
    checkpoint = models[case.checkpoint]
    lora = {"lora_modules": {"a": str(models["adapter"])}}
    want, _, _ = await _serve(checkpoint, case.together, **case.flags, **lora)
    assert want[1] != want[3]  # the adapter changes the output
    plain = models.get(f"{case.checkpoint}-plain")
    if plain is not None:  # the engine serves the dequantized weights: transformers (+ PEFT) on them is the reference
        assert want[0] == hf_greedy(load_hf(plain), PROMPTS[0], TOKENS)
        assert want[1] == peft_greedy(plain, models["adapter"], PROMPTS[1], ADAPTED_TOKENS)
    features = {**case.flags, **lora, "async_scheduling": True, "num_draft_tokens": 2}
    for speculative in ({"speculative": "ngram"}, {"speculative": "draft", "draft_model": str(checkpoint)}):
        got, text, engine = await _serve(checkpoint, case.together, **features, **speculative)
        assert got == want, speculative
        assert re.fullmatch(REGEX, text[2]), text[2]
        stats = engine.stats()
        assert engine.core.async_scheduling and stats.spec_draft_tokens > 0, speculative
        if speculative["speculative"] == "draft":
            assert stats.spec_accepted_tokens > 0  # the draft is the target: its base proposals are all accepted
        if DEVICE != "cpu":  # CUDA graphs replay steps, speculative ones and adapters' too
            assert stats.eager_iterations < stats.iterations
        elif case.cpp_steps:
            assert isinstance(engine.runner.graphs, NativeDecode)
            assert stats.eager_iterations < stats.iterations  # steps with no adapter row (speculative too): C++
