"""CPU settings (dtype and --cpu-quantization): speed of the native engine with each, and what each costs in
quality (perplexity on held-out text), in one run; the setting the defaults pick on this machine is marked.

    python -m benchmarks.cpu_quantization                   # the default model (SmolLM2-135M-Instruct)
    python -m benchmarks.cpu_quantization --append-results  # also a dated section in RESULTS.md

Speed: the engine in this process (no HTTP), greedy, exact lengths; inter-token gap at concurrency 1 and
output tok/s at 16 concurrent requests, the settings interleaved over --rounds. Quality: transformers'
model with the checkpoint's weights in the setting's dtype, with every projection and the output head replaced
by their round trip through the setting's format (what its kernel multiplies by), perplexity over windows of
docs/scaling.md (text the model never saw). Speed is compared with the first setting, perplexity with bf16
without quantization (the quality guard of the defaults: within 1%), both in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from benchmarks.overhead import RESULTS_MD, _commit, _machine
from benchmarks.report import append_section, markdown_table
from runtime.config import EngineConfig
from runtime.native.llm_engine import NativeEngine
from runtime.native.models import cpu_weights
from runtime.native.models.cpu_weights import Quantization, quantize_int4, quantize_int8
from runtime.request import GenerationRequest, SamplingOptions

TEXT = Path(__file__).resolve().parent.parent / "docs" / "scaling.md"


async def _speed(model: str, dtype: str, quantization: str, args: argparse.Namespace) -> dict[str, float]:
    engine = NativeEngine(EngineConfig(model=model, device="cpu", dtype=dtype, max_batch_size=16,
                                       max_num_tokens=2048, max_kv_tokens=max(16 * (args.prompt + args.output + 16), 8192),
                                       cpu_quantization=quantization))
    await engine.start()
    await engine.warmed_up()  # the CPU's compiled steps, built while eager ones serve

    def req(rid: str) -> GenerationRequest:
        return GenerationRequest(rid, prompt_token_ids=[(7 * i + len(rid)) % 200 + 10 for i in range(args.prompt)],
                                 sampling=SamplingOptions(max_tokens=args.output, ignore_eos=True, temperature=0.0))

    async def one(rid: str) -> list[float]:
        stamps = []
        async for _ in engine.generate(req(rid)):
            stamps.append(time.perf_counter())
        return [b - a for a, b in zip(stamps, stamps[1:])]

    try:
        await one("warm")
        gaps = await one("c1")
        t = time.perf_counter()
        await asyncio.gather(*(one(f"c16-{i}") for i in range(16)))
        wall = time.perf_counter() - t
    finally:
        await engine.shutdown()
    return {"itl_ms": statistics.median(gaps) * 1e3, "tok_s_16": 16 * args.output / wall}


def _perplexity(model: Any, ids: list[int], window: int) -> float:
    nll, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, window):
            chunk = torch.tensor([ids[start:start + window + 1]], device=model.device)
            if chunk.shape[1] < 2:
                break
            logits = model(chunk[:, :-1]).logits.float()
            nll += torch.nn.functional.cross_entropy(logits[0], chunk[0, 1:], reduction="sum").item()
            count += chunk.shape[1] - 1
    return math.exp(nll / count)


def perplexities(model_path: str, dtype: torch.dtype, window: int, max_tokens: int, settings: Sequence[str],
                 replace: Callable[[str, str, torch.nn.Linear], None],
                 device: str = "cpu") -> tuple[int, dict[str, float]]:
    """(tokens scored, perplexity per setting) of transformers' model of `model_path` on `device`, each of its
    Linears (name, module) given to `replace(setting, name, module)` first, under no_grad."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    ids = tokenizer(TEXT.read_text())["input_ids"][:max_tokens]
    perplexity = {}
    for setting in settings:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).eval()
        with torch.no_grad():
            for name, module in model.named_modules():
                if isinstance(module, torch.nn.Linear):
                    replace(setting, name, module)
        perplexity[setting] = _perplexity(model, ids, window)
    return len(ids), perplexity


def _round_trip(quantization: str, name: str, module: torch.nn.Linear) -> None:
    """The projections and the output head, as the engine's copies (an int4 model's head is int8)."""
    if quantization != "none":
        int4 = quantization == "int4" and name != "lm_head" and cpu_weights.int4_fits(module.weight)
        quantized = (quantize_int4 if int4 else quantize_int8)(module.weight)
        module.weight = torch.nn.Parameter(quantized.dequantize())


def _quality(model_path: str, window: int, max_tokens: int,
             settings: list[tuple[str, Quantization]]) -> tuple[int, dict[tuple[str, Quantization], float]]:
    """(tokens scored, perplexity per dtype and quantization setting)."""
    tokens, perplexity = 0, {}
    for dtype in dict.fromkeys(d for d, _ in settings):
        tokens, by_quantization = perplexities(model_path, getattr(torch, dtype), window, max_tokens,
                                               [q for d, q in settings if d == dtype], _round_trip)
        perplexity.update({(dtype, q): value for q, value in by_quantization.items()})
    return tokens, perplexity


def _default_setting(model: str) -> tuple[str, Quantization]:
    """What our server picks on this machine with no options (runtime/native/cpu/defaults.py)."""
    from runtime.model_spec import ModelSpec
    from runtime.native.cpu.defaults import (
        CpuFeatures,
        cpu_dtype,
        cpu_quantization,
        source_quantization,
    )
    from runtime.native.device import DTYPES

    spec = ModelSpec.from_pretrained(model)
    source = source_quantization(spec.config)
    dtype = cpu_dtype("auto", DTYPES[spec.dtype], source, CpuFeatures.detect())
    return str(dtype).removeprefix("torch."), cpu_quantization("auto", source)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="checkpoint folder or GGUF (default: the default model)")
    p.add_argument("--settings", default="float32:none,bfloat16:none,bfloat16:int8,bfloat16:int4",
                   help="dtype:quantization pairs to compare; speed is compared with the first")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--output", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--window", type=int, default=512, help="perplexity window, tokens")
    p.add_argument("--text-tokens", type=int, default=4096, help="most tokens of the held-out text scored")
    p.add_argument("--note", default="")
    p.add_argument("--append-results", action="store_true")
    args = p.parse_args(argv)
    console = Console()
    from runtime.default_model import resolve_model

    model = resolve_model(args.model)[0]
    command = "python -m benchmarks.cpu_quantization " + shlex.join(sys.argv[1:] if argv is None else argv)
    settings: list[tuple[str, Quantization]] = [tuple(x.split(":")) for x in args.settings.split(",")]  # type: ignore[misc]
    default = _default_setting(model)
    speed: dict[tuple[str, Quantization], list[dict[str, float]]] = {q: [] for q in settings}
    for r in range(args.rounds):
        for setting in (settings if r % 2 == 0 else settings[::-1]):
            s = asyncio.run(_speed(model, *setting, args))
            speed[setting].append(s)
            console.print(f"round {r + 1} {':'.join(setting)}: ITL {s['itl_ms']:.1f} ms, {s['tok_s_16']:.0f} tok/s at 16")
    tokens, perplexity = _quality(model, args.window, args.text_tokens, settings)

    def med(q: tuple[str, Quantization], key: str) -> float:
        return statistics.median(s[key] for s in speed[q])

    base = settings[0]
    reference = perplexity.get(("bfloat16", "none"))
    rows = [[f"{d} {q}" + (" (the default here)" if (d, q) == default else ""), f"{med((d, q), 'itl_ms'):.1f}",
             f"{med(base, 'itl_ms') / med((d, q), 'itl_ms'):.2f}x", f"{med((d, q), 'tok_s_16'):.0f}",
             f"{med((d, q), 'tok_s_16') / med(base, 'tok_s_16'):.2f}x", f"{perplexity[d, q]:.3f}",
             f"{100 * (perplexity[d, q] / reference - 1):+.2f}%" if reference else "-"] for d, q in settings]
    cols = ["dtype, --cpu-quantization", "ITL c=1 ms", "speed-up", "tok/s c=16", f"vs {' '.join(base)}", "perplexity",
            "vs bfloat16 none"]
    table = markdown_table(cols, rows)
    console.print(table)
    md = "\n".join([
        f"\n## {time.strftime('%Y-%m-%d %H:%M')} CPU settings {', '.join(map(' '.join, settings))} ({Path(model).name})\n",
        f"- machine: {_machine()}" + (f"; {args.note}" if args.note else ""),
        f"- commit: {_commit()}", f"- command: `{command}`",
        f"- the default here: {' '.join(default)} (runtime/native/cpu/defaults.py); speed: the engine in-process, its own "
        f"default threads and decode steps, prompt {args.prompt}, {args.output} output tokens, medians of "
        f"{args.rounds} interleaved rounds; perplexity: {tokens} tokens of docs/scaling.md in windows of {args.window} "
        "(transformers in the setting's dtype; every projection and the output head replaced by its round trip "
        "through the setting's format)\n", table, ""])
    if args.append_results:
        append_section(RESULTS_MD, md, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
