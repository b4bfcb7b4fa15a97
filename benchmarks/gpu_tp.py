"""Tensor parallelism on two GPUs against one (issue 45), every figure from the same run.

    python -m benchmarks.gpu_tp --out DIR                  # on a 2-GPU machine: the Llama-3.1-8B shape
    python -m benchmarks.gpu_tp --smoke --device cpu --out DIR   # the tiny shape on gloo, seconds (tests/benchmarks)

A random bf16 checkpoint of the shape (benchmarks/gpu_models.make_checkpoint; the shape is gpu_families'), served by
NativeEngine in this process as rank 0 (the worker processes of the other ranks start with it). Engines, in turn:
  tp1         one GPU, as served by default (CUDA graphs for decode and prefill steps)
  tp1_eager   one GPU without CUDA graphs
  tp2         --tensor-parallel-size 2 (NCCL), as served by default: decode steps from CUDA graphs that hold the
              collectives, prompts op by op
  tp2_eager   --tensor-parallel-size 2 without CUDA graphs
Each: load seconds, batch-1 decode (inter-token ms, p50 over 64 tokens of a 128-token prompt), 256 requests of
128 in / 128 out all at once (output tok/s). The tp2 engines also run under torch.profiler for a batch-1 decode and
a short 256-row window: the all-reduce (and logits all-gather) kernel time per step on rank 0's GPU, and its share of
the step's kernel time (LABEL_trace_b1.json: the trace). Then tp2/tp2_eager against tp1/tp1_eager. Results in
DIR/gpu_tp.json, written after each engine; an engine that fails is recorded with its traceback, the others still
run, and the run exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from benchmarks import gpu_models as gm
from benchmarks.gpu_bench import FULL, SMOKE, Sizes, _request, _stream, engine_config
from benchmarks.gpu_families import SHAPES

SHAPE = "llama-3.1-8b"
# label -> (tensor parallel size, CUDA graphs)
ENGINES = {"tp1": (1, True), "tp2": (2, True), "tp2_eager": (2, False), "tp1_eager": (1, False)}  # most wanted first
# tokens generated per request: warm-up, the timed batch-1 stream, the batch-1 and the batch profiler windows
TOKENS = dict(warmup=8, b1=65, trace_b1=33, trace_batch=16)
SMOKE_TOKENS = dict(warmup=2, b1=5, trace_b1=3, trace_batch=2)  # --smoke: each path runs, a few steps


def shape(smoke: bool) -> dict[str, Any]:
    """The Llama-3.1-8B shape (gpu_families.SHAPES), or gpu_models.TINY with --smoke; make_checkpoint sets RoPE."""
    if smoke:
        return gm.TINY
    return {k: v for k, v in SHAPES[SHAPE][1].items() if k != "rope_theta"}


async def measure(folder: Path, device: str, s: Sizes, tokens: dict[str, int], size: int, graphs: bool,
                  trace: Path | None) -> dict[str, Any]:
    from runtime.native.llm_engine import NativeEngine

    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    cfg = dataclasses.replace(engine_config(folder, device, s), tensor_parallel_size=size, enable_cuda_graphs=graphs)
    res: dict[str, Any] = {}
    t0 = time.perf_counter()
    engine = NativeEngine(cfg)
    await engine.start()
    res["load_s"] = time.perf_counter() - t0
    try:
        prompts = gm.random_prompts(s.batch, s.prompt, vocab, seed=1)
        await asyncio.gather(*(_stream(engine, _request(f"w{i}", p, tokens["warmup"]))
                               for i, p in enumerate(prompts)))
        b1_prompt = gm.random_prompts(1, s.prompt, vocab, 2)[0]
        _, arrivals, _ = await _stream(engine, _request("b1", b1_prompt, tokens["b1"]))
        res["decode_b1_itl_ms_p50"] = statistics.median(b - a for a, b in zip(arrivals[1:], arrivals[2:])) * 1e3
        t = time.perf_counter()
        done = await asyncio.gather(*(_stream(engine, _request(f"t{i}", p, s.output)) for i, p in enumerate(prompts)))
        res[f"throughput_{s.batch}_tok_s"] = sum(d[2] for d in done) / (time.perf_counter() - t)
        if trace is not None:
            res["collectives_b1"] = await collectives(engine, [gm.random_prompts(1, s.prompt, vocab, 3)[0]],
                                                      tokens["trace_b1"], trace)
            res["collectives_batch"] = await collectives(engine, gm.random_prompts(s.batch, s.prompt, vocab, 4),
                                                         tokens["trace_batch"], None)
    finally:
        await engine.shutdown()
        del engine
        if torch.cuda.is_available():
            gc.collect()
            torch.cuda.empty_cache()
    return res


async def collectives(engine: Any, prompts: list[list[int]], tokens: int, trace: Path | None) -> dict[str, Any]:
    """Device time per step of the all-reduces and all-gathers (NCCL kernels; gloo's ops on the CPU) on rank 0, over
    the steps of `prompts` generating `tokens` each, and the share of all the step's kernel time they take."""
    from torch.profiler import ProfilerActivity, profile

    device = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device else [])
    # CUDA kernels are seen whichever thread launched them; on the CPU, the step thread's ops only with this
    config = None if device else torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    steps = engine.stats().iterations
    with profile(activities=activities, experimental_config=config) as prof:
        await asyncio.gather(*(_stream(engine, _request(f"p{i}", p, tokens)) for i, p in enumerate(prompts)))
    steps = engine.stats().iterations - steps
    if trace is not None:
        prof.export_chrome_trace(str(trace))

    def time_us(event: Any) -> float:
        if device:
            return getattr(event, "self_device_time_total", 0.0) or getattr(event, "self_cuda_time_total", 0.0)
        return event.self_cpu_time_total

    table = prof.key_averages()
    kernels = [e for e in table if time_us(e) > 0 and (not device or e.device_type.name == "CUDA")]  # (no CPU ops)
    total = sum(time_us(e) for e in kernels)
    reduce = sum(time_us(e) for e in kernels if "allreduce" in e.key.lower().replace("_", ""))
    gather = sum(time_us(e) for e in kernels if "allgather" in e.key.lower().replace("_", ""))
    return {"steps": steps, "all_reduce_us_per_step": reduce / max(steps, 1),
            "all_gather_us_per_step": gather / max(steps, 1), "kernel_us_per_step": total / max(steps, 1),
            "collective_share": (reduce + gather) / total if total else float("nan")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu_tp_models"), help="where the checkpoint goes")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--smoke", action="store_true", help="the tiny shape and loads: proves the code runs")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"a subset of {','.join(ENGINES)}")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    s, tokens = (SMOKE, SMOKE_TOKENS) if args.smoke else (FULL, TOKENS)
    folder = gm.make_checkpoint(args.work / ("tiny" if args.smoke else SHAPE), shape(args.smoke), torch.bfloat16)
    results: dict[str, Any] = {"shape": "tiny" if args.smoke else SHAPE, "device": args.device,
                               "gpus": torch.cuda.device_count(), "batch": s.batch, "prompt": s.prompt,
                               "output": s.output}
    failed = False
    for label in args.engines.split(","):
        size, graphs = ENGINES[label]
        print(f"gpu_tp: {label} (tensor parallel size {size}, CUDA graphs {graphs})", flush=True)
        try:
            results[label] = asyncio.run(measure(folder, args.device, s, tokens, size, graphs,
                                                 args.out / f"{label}_trace_b1.json" if size > 1 else None))
        except Exception:  # noqa: BLE001 - recorded; the other engines still run
            failed = True
            results[label] = {"error": traceback.format_exc()}
            traceback.print_exc()
        (args.out / "gpu_tp.json").write_text(json.dumps(results, indent=1))
        print(f"gpu_tp: {label} {json.dumps(results[label])[:600]}", flush=True)
    for new, base in (("tp2", "tp1"), ("tp2_eager", "tp1_eager"), ("tp2_eager", "tp1")):  # time per token, tok/s
        one, two = results.get(base, {}), results.get(new, {})
        if "decode_b1_itl_ms_p50" in one and "decode_b1_itl_ms_p50" in two:
            results[f"{new}_vs_{base}"] = {
                "decode_b1_time_ratio": two["decode_b1_itl_ms_p50"] / one["decode_b1_itl_ms_p50"],
                "throughput_ratio": two[f"throughput_{s.batch}_tok_s"] / one[f"throughput_{s.batch}_tok_s"]}
    (args.out / "gpu_tp.json").write_text(json.dumps(results, indent=1))
    print("gpu_tp: ratios " + json.dumps({k: v for k, v in results.items() if "_vs_" in k}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
