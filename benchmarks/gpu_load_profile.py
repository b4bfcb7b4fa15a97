"""Issue 48's profile: where the time goes under load at real sizes, one GPU, random bf16 weights.

    python -m benchmarks.gpu_load_profile --out DIR                          # H200: 8B and 1B shapes, ~5 minutes
    python -m benchmarks.gpu_load_profile --out DIR --shapes llama-3.1-8b --max-num-tokens 2048,4096,8192
    python -m benchmarks.gpu_load_profile --smoke --device cpu --out DIR     # tiny shapes on the CPU, seconds
    python -m benchmarks.gpu_load_profile --out DIR --shapes llama-3.1-8b --mix-only --mix-kv-dtypes auto,fp8 \
        --mix-kv-fraction 0.4                                                # issue 44: where bf16 runs out of blocks

Per shape, NativeEngine in this process (CUDA graphs, async scheduling: the server's engine), up to 256 sequences a
step, `--max-num-tokens` tokens a step ("default": the engine's choice; the first value is profiled, after the others,
which are only timed):
  throughput_256   256 requests of 128 in / 128 out at once: output tok/s, the steps' wall time split into steps that
                   prefill (with the decode rows beside them) and pure decode steps, and their counts
  kernels          the same load under torch.profiler: GPU time by kind (gemm, attention, norm/act/rope, sampling,
                   copy/index, other), the top kernels, and the GPU's busy time against the run's span (the gaps)
  ttft_1024        a 1,024-token prompt alone, back to back, the median of 22 after two (the first ones after the
                   load phases read 0.3-0.4 ms longer on the 1B: 5.3 ms as a median of 5, 4.9 of 1,592): against
                   its FLOP floor (2 x parameters x tokens plus causal
                   attention's 2 x layers x heads x head_dim x tokens^2) at PEAK_TFLOPS; then one more profiled
                   (gpu_bench's step wall times against their kernel time, the table in DIR/<shape>_ttft_profile.txt)
  itl_64, itl_256  closed-loop streams (128 in / 128 out) for ITL_S seconds: inter-token gaps p50/p99, output tok/s
  mix_512          (--mix-shapes) 512 closed-loop streams of 1,024 in / 256 out for MIX_S seconds, up to 512 sequences
                   a step and the KV cache the server would size: output tok/s, ITL p50/p99, TTFT p50; once per
                   --mix-kv-dtypes (auto: the model's dtype; fp8: --kv-cache-dtype fp8, twice the tokens)
  core_...         (--core-shapes) throughput_256 and itl_* again with the engine core in its own process (the
                   server's default; this process only consumes its streams): a random checkpoint written to DIR
Results go to DIR/gpu_load_profile.json after every phase (a failed phase is recorded, the others still run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import gpu_families as gf
from benchmarks import gpu_models as gm
from benchmarks.gpu_bench import _pct, _request, _stream, _ttft_steps

PEAK_TFLOPS = 790.0  # the H200's dense bf16 tensor-core rate (KINDS.md)
SHAPES = {"llama-3.1-8b": gf.SHAPES["llama-3.1-8b"],
          "llama-3.2-1b": ("llama", dict(gm.LLAMA_1B, max_position_embeddings=4096, rope_theta=500000.0))}
FULL = dict(prompt=128, output=128, batch=256, ttft_prompt=1024, ttft_requests=24, itl_s=8.0, itl_streams=(64, 256))
# smoke loads: 0.1 s closed loops still run a request or more per stream (each a few inter-token gaps)
SMOKE = dict(prompt=16, output=4, batch=8, ttft_prompt=32, ttft_requests=3, itl_s=0.1, itl_streams=(2, 8))
MIX = dict(streams=512, prompt=1024, output=256, seconds=30.0)
MIX_SMOKE = dict(streams=4, prompt=32, output=8, seconds=0.1)
# kernel kinds by a piece of the kernel's name, the first match wins
KINDS = (("sampling", ("argmax", "topk", "top_k", "softmax", "sample", "multinomial", "sort")),
         ("attention", ("_decode_kernel", "_prefill_kernel", "store_kv", "attention", "attn", "flash", "fmha")),
         ("gemm", ("gemm", "gemv", "nvjet", "cutlass", "xmma", "matmul", "splitk", "cublas", "_expand_kernel")),
         ("norm/act/rope", ("norm", "silu", "gelu", "gated", "rope", "rotary")),
         ("copy/index", ("copy", "memcpy", "memset", "index", "gather", "scatter", "cat", "fill", "step_inputs")))


def kind_of(kernel: str) -> str:
    name = kernel.lower()
    return next((kind for kind, parts in KINDS if any(p in name for p in parts)), "other")


def kernel_summary(trace: Path) -> dict[str, Any]:
    """GPU time by kind and by kernel from a chrome trace, and the busy time (the union of kernel intervals) against
    the span from the first kernel's start to the last one's end."""
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "kernel"]
    if not events:
        return {"kernels": 0}
    by_kind: dict[str, float] = {}
    by_name: dict[str, list[float]] = {}
    for e in events:
        by_kind[kind_of(e["name"])] = by_kind.get(kind_of(e["name"]), 0.0) + e["dur"]
        entry = by_name.setdefault(e["name"][:90], [0.0, 0])
        entry[0] += e["dur"]
        entry[1] += 1
    busy, end = 0.0, float("-inf")
    for e in sorted(events, key=lambda e: e["ts"]):
        start, stop = e["ts"], e["ts"] + e["dur"]
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    span = end - min(e["ts"] for e in events)
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:25]
    return {"kernels": len(events), "span_ms": span / 1e3, "busy_ms": busy / 1e3, "idle_share": 1 - busy / span,
            "by_kind_ms": {k: round(v / 1e3, 2) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "top_ms_count": [(name, round(t / 1e3, 2), n) for name, (t, n) in top]}


def flop_floor_ms(model: Any, tokens: int) -> float:
    """A prompt's FLOPs at PEAK_TFLOPS: every weight of the layers and the output head once per token (the embedding
    is a lookup), causal attention's scores and values (half of the square)."""
    spec = model.spec
    params = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)
    if model.lm_head is None:  # a tied output head is the embedding matrix
        params += model.model.embed_tokens.weight.numel()
    attention = 2 * spec.num_layers * spec.num_heads * spec.head_dim * tokens * tokens
    return (2 * params * tokens + attention) / (PEAK_TFLOPS * 1e12) * 1e3


class StepLog:
    """Every engine step's wall time with what it ran: prefill tokens and decode rows (the scheduler's batch)."""

    def __init__(self, engine: Any) -> None:
        self.steps: list[tuple[int, int, float]] = []
        self.engine, core = engine, engine.core
        schedule, step = core.scheduler.schedule, engine.step
        last: list[Any] = [None]

        def logged_schedule() -> Any:
            last[0] = batch = schedule()
            return batch

        def timed_step() -> int:
            last[0] = None
            t = time.perf_counter()
            n = step()
            batch = last[0]
            if batch:
                prefill = sum(k for k, p in zip(batch.num_new, batch.prefill) if p)
                self.steps.append((prefill, sum(1 for p in batch.prefill if not p), time.perf_counter() - t))
            return n

        core.scheduler.schedule, engine.step = logged_schedule, timed_step

    def summary(self) -> dict[str, Any]:
        prefill = [t for p, _, t in self.steps if p]
        decode = [t for p, _, t in self.steps if not p]
        full = [t for p, d, t in self.steps if not p and d == max((d for _, d, _ in self.steps), default=0)]
        return {"steps": len(self.steps), "prefill_steps": len(prefill), "prefill_s": sum(prefill),
                "prefill_tokens": sum(p for p, _, _ in self.steps), "decode_steps": len(decode),
                "decode_s": sum(decode), "full_decode_step_ms_p50": statistics.median(full) * 1e3 if full else None,
                "mixed": [(p, d, round(t * 1e3, 2)) for p, d, t in self.steps if p][:40]}


async def throughput(engine: Any, s: dict[str, Any], vocab: int, seed: int) -> dict[str, Any]:
    prompts = gm.random_prompts(s["batch"], s["prompt"], vocab, seed)
    t = time.perf_counter()
    done = await asyncio.gather(*(_stream(engine, _request(f"tp{seed}-{i}", p, s["output"]))
                                  for i, p in enumerate(prompts)))
    wall = time.perf_counter() - t
    return {"tok_s": sum(d[2] for d in done) / wall, "wall_s": wall}


async def closed_loop_itl(engine: Any, s: dict[str, Any], streams: int, vocab: int, seed: int) -> dict[str, Any]:
    prompts = gm.random_prompts(4 * streams, s["prompt"], vocab, seed)
    stop_at = time.perf_counter() + s["itl_s"]
    gaps: list[float] = []
    ttfts: list[float] = []
    tokens = 0

    async def worker(w: int) -> None:
        nonlocal tokens
        i = w
        while time.perf_counter() < stop_at:
            t, arrivals, n = await _stream(engine, _request(f"itl{streams}-{w}-{i}", prompts[i % len(prompts)],
                                                            s["output"]))
            ttfts.append(arrivals[0] - t)
            gaps.extend(b - a for a, b in zip(arrivals, arrivals[1:]))
            tokens += n
            i += streams

    t = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(streams)))
    return {"tok_s": tokens / (time.perf_counter() - t), "itl_ms_p50": _pct(gaps, 0.5) * 1e3,
            "itl_ms_p99": _pct(gaps, 0.99) * 1e3, "ttft_ms_p50": _pct(ttfts, 0.5) * 1e3, "requests": len(ttfts)}


async def shape_figures(folder: Path, device: str, s: dict[str, Any], max_num_tokens: int | None, out: Path,
                        profile: bool, record: Any, quantization: str = "none") -> None:
    from runtime.config import EngineConfig
    from runtime.native.llm_engine import NativeEngine

    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    cfg = EngineConfig(model=str(folder), device=device, dtype="bfloat16", max_batch_size=s["batch"],
                       max_num_tokens=max_num_tokens, max_kv_tokens=4 * s["batch"] * (s["prompt"] + s["output"]),
                       max_model_len=2 * s["ttft_prompt"], enable_prefix_caching=False, quantization=quantization)
    engine = NativeEngine(cfg)
    await engine.start()
    weights = "" if quantization == "none" else f"_{quantization}"
    tag = f"{folder.name}{weights}_t{max_num_tokens or engine.model_info.max_num_tokens}"
    try:
        await throughput(engine, dict(s, output=8), vocab, 1)  # warm-up: every prefill shape and a full decode batch
        log = StepLog(engine)
        res = await throughput(engine, s, vocab, 2)
        res.update(log.summary())
        record(f"{tag}_throughput_{s['batch']}", lambda: res)
        if not profile:
            return
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        trace = out / f"{tag}_trace.json"
        cuda = torch.device(device).type == "cuda"
        prof = torch_profile(activities=[ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU])
        # entered and left in the engine's step thread (the profiler belongs to the thread that enters it); a
        # one-token request after the load drives the step that leaves it
        state = {"on": False, "stop": False}
        step = engine.step

        def profiled_step() -> int:
            if state["stop"] and state["on"]:
                prof.__exit__(None, None, None)
                state["on"] = False
            elif not state["stop"] and not state["on"]:
                prof.__enter__()
                state["on"] = True
            return step()

        engine.step = profiled_step
        profiled = await throughput(engine, s, vocab, 3)
        state["stop"] = True
        await _stream(engine, _request("profile-end", gm.random_prompts(1, 8, vocab, 9)[0], 1))
        engine.step = step
        prof.export_chrome_trace(str(trace))
        record(f"{tag}_kernels", lambda: dict(kernel_summary(trace), profiled_tok_s=profiled["tok_s"]) if cuda
               else {"cpu": True})
        trace.unlink()
        ttfts = []
        for i, p in enumerate(gm.random_prompts(s["ttft_requests"], s["ttft_prompt"], vocab, 4)):
            t, arrivals, _ = await _stream(engine, _request(f"ttft{i}", p, 1))
            ttfts.append(arrivals[0] - t)
        floor = flop_floor_ms(engine.runner.model, s["ttft_prompt"])
        ttft = statistics.median(ttfts[2:]) * 1e3
        steps = await _ttft_steps(engine, gm.random_prompts(1, s["ttft_prompt"], vocab, 6)[0],
                                  out / f"{folder.name}_ttft_profile.txt")
        record(f"{folder.name}_ttft_{s['ttft_prompt']}", lambda: {
            "ms_p50": ttft, "flop_floor_ms": floor, "vs_floor": ttft / floor,
            "profiled": {k: steps[k] for k in ("ttft_ms", "step_ms", "kernel_ms", "kernels", "top_host_ms")}})
        for streams in s["itl_streams"]:
            figures = await closed_loop_itl(engine, s, streams, vocab, 5 + streams)
            record(f"{folder.name}_itl_{streams}", lambda: figures)
    finally:
        await engine.shutdown()


async def mix_figures(folder: Path, device: str, m: dict[str, Any], kv_dtype: str,
                      kv_fraction: float | None = None) -> dict[str, Any]:
    """`m["streams"]` closed-loop streams of m["prompt"] in / m["output"] out for m["seconds"] (module docstring), the
    KV cache `kv_fraction` of the memory left after the weights (None: the server's kv_cache_fraction)."""
    from runtime.config import EngineConfig
    from runtime.native.llm_engine import NativeEngine

    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    engine = NativeEngine(EngineConfig(model=str(folder), device=device, dtype="bfloat16", max_batch_size=m["streams"],
                                       max_model_len=2 * (m["prompt"] + m["output"]), enable_prefix_caching=False,
                                       kv_cache_dtype=kv_dtype,
                                       kv_cache_fraction=kv_fraction or EngineConfig.kv_cache_fraction,
                                       **({} if torch.device(device).type == "cuda" else {"max_kv_tokens": 8192})))
    await engine.start()
    try:
        loads = dict(prompt=m["prompt"], output=m["output"], itl_s=m["seconds"])
        st = engine.stats()
        return dict(await closed_loop_itl(engine, loads, m["streams"], vocab, 11),
                    kv_tokens=st.kv_blocks_total * st.kv_tokens_per_block)
    finally:
        await engine.shutdown()


async def core_figures(folder: Path, device: str, s: dict[str, Any], max_num_tokens: int | None, record: Any,
                       quantization: str = "none") -> None:
    """throughput and ITL (module docstring) with the engine core in its own process, over a checkpoint on disk."""
    from runtime.config import EngineConfig
    from runtime.process.client import EngineClient

    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    engine = EngineClient(EngineConfig(model=str(folder), device=device, dtype="bfloat16", max_batch_size=s["batch"],
                                       max_num_tokens=max_num_tokens,
                                       max_kv_tokens=4 * s["batch"] * (s["prompt"] + s["output"]),
                                       max_model_len=2 * s["ttft_prompt"], enable_prefix_caching=False,
                                       quantization=quantization))
    await engine.start()
    tag = f"core_{folder.name}" + ("" if quantization == "none" else f"_{quantization}")
    try:
        await throughput(engine, dict(s, output=8), vocab, 1)
        res = await throughput(engine, s, vocab, 2)
        record(f"{tag}_throughput_{s['batch']}", lambda: res)
        for streams in s["itl_streams"]:
            figures = await closed_loop_itl(engine, s, streams, vocab, 5 + streams)
            record(f"{tag}_itl_{streams}", lambda: figures)
    finally:
        await engine.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, help="folder for the configs and checkpoints (default: --out)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", default="llama-3.1-8b,llama-3.2-1b")
    parser.add_argument("--max-num-tokens", default="default",
                        help="tokens a step (default: the engine's for the model); the first is profiled, the rest "
                             "timed, and the engine core's phase runs the first")
    parser.add_argument("--mix-shapes", default="llama-3.1-8b", help="shapes that also get the 512-stream mix")
    parser.add_argument("--mix-kv-dtypes", default="auto", help="KV cache dtypes the mix runs with: auto, fp8")
    parser.add_argument("--mix-kv-fraction", type=float, default=None,
                        help="the mix's KV cache as a fraction of the memory left after the weights (default: the "
                             "server's; lower, to see bf16 run out of blocks where FP8 does not)")
    parser.add_argument("--core-shapes", default="llama-3.2-1b",
                        help="shapes also run through the engine core in its own process")
    parser.add_argument("--quantization", default="none", choices=["none", "fp8"],
                        help="the weights: as stored, or FP8 quantized at load (--quantization fp8)")
    parser.add_argument("--core-only", action="store_true", help="only the engine core phases (--core-shapes)")
    parser.add_argument("--mix-only", action="store_true", help="only the 512-stream mixes (--mix-shapes)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and loads: the code runs, nothing more")
    args = parser.parse_args(argv)
    import runtime.native.core_loader

    runtime.native.core_loader.load_model = gf.random_model  # random weights at real shapes, no checkpoint on disk
    s, mix = (SMOKE, MIX_SMOKE) if args.smoke else (FULL, MIX)
    args.out.mkdir(parents=True, exist_ok=True)
    phases = gf.Phases(args.out / "gpu_load_profile.json", {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device, "sizes": s,
        "date": time.strftime("%Y-%m-%d %H:%M")})
    for name in args.shapes.split(","):
        model_type, shape = (gf.SMOKE_SHAPES["llama-3.1-8b"] if args.smoke else SHAPES[name])
        folder = gf.write_config((args.work or args.out) / name, model_type, shape)
        token_counts = [None if t == "default" else int(t) for t in args.max_num_tokens.split(",")]
        # the profiled (first) value runs last: a value timed after the profiler had run in this process read 31% low
        # (its prompt steps 95 ms against 60 ms; RESULTS.md 2026-11-29 23:58)
        timed_first = token_counts[1:] + token_counts[:1]
        for i, tokens in enumerate(timed_first if not (args.core_only or args.mix_only) else []):
            phases.record(f"{name}_t{tokens or 'default'}", lambda: asyncio.run(
                shape_figures(folder, args.device, s, tokens, args.out, i == len(timed_first) - 1, phases.record,
                              args.quantization)) or "done")
        if name in args.mix_shapes.split(",") and not args.core_only:
            for kv in args.mix_kv_dtypes.split(","):
                fraction = "" if args.mix_kv_fraction is None else f"_of_{args.mix_kv_fraction}"
                phases.record(f"{name}_mix_{mix['streams']}_kv_{kv}{fraction}",
                              lambda: asyncio.run(mix_figures(folder, args.device, mix, kv, args.mix_kv_fraction)))
        if name in args.core_shapes.split(",") and not args.mix_only:  # the child loads a checkpoint: random weights saved
            llama = {k: v for k, v in shape.items() if k not in ("max_position_embeddings", "rope_theta")}
            checkpoint = gm.make_checkpoint((args.work or args.out) / "checkpoints" / name, llama, torch.bfloat16)
            phases.record(f"core_{name}", lambda: asyncio.run(
                core_figures(checkpoint, args.device, s, token_counts[0], phases.record, args.quantization)) or "done")
    phases.write()
    return 1 if phases.failed else 0


if __name__ == "__main__":
    sys.exit(main())
