"""LoRA step-time benchmark: one engine step (forward + sampling) with 8 different adapters in the batch
against the same batch on the base model alone.

    python -m benchmarks.lora_step                          # demo model, CPU
    python -m benchmarks.lora_step --model PATH --device cuda --batch 8 32 128 --rank 16
    python -m benchmarks.lora_step --synthetic 1b --device cuda     # random-weight Llama of that shape

Builds the native engine's model runner and LoRA manager (no HTTP, no scheduler), places N random
adapters (rank --rank on every projection) in device slots, and times ModelRunner.execute on decode
batches (every sequence at --context tokens, one new token each) and on one prefill step (--prefill
tokens split over the batch). Sequences take adapters round-robin, so every step mixes all of them.
Reports the median of --iters timed steps after --warmup, and the ratio to the base-model step.
On CUDA each execute row says whether the engine replayed its own decode graphs for the base and the
adapter step ("graph") or ran them eagerly; --graph adds rows for the bare model forward captured here,
for comparison. Target (issue #6): at most 1.3x on the GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from benchmarks.cuda_timing import ms_per_call
from runtime.config import EngineConfig
from runtime.demo import demo_model_path
from runtime.native.llm_engine import NativeEngine
from runtime.native.lora.weights import LoraPair, LoraWeights
from runtime.request import SamplingOptions
from runtime.native.sampler import SamplingRow
from runtime.native.step_inputs import StepInput, StepInputs


# Llama shapes for --synthetic: hidden, layers, intermediate, heads, kv heads (vocab 32000).
SYNTHETIC = {"tiny": (256, 6, 704, 8, 2), "1b": (2048, 16, 8192, 32, 8), "8b": (4096, 32, 14336, 32, 8)}


def synthetic_model(size: str, folder: Path, device: str = "cpu") -> str:
    """Write a random-weight bf16 Llama checkpoint of a SYNTHETIC shape (no download); the demo model's
    tokenizer serves it (the benchmark feeds token ids)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, inter, heads, kv_heads = SYNTHETIC[size]
    config = LlamaConfig(vocab_size=32000, hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=4096)
    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model = model.to_empty(device=device)  # random init on the GPU is much faster
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    model.save_pretrained(folder)
    return str(folder)


def random_adapter(engine: NativeEngine, rank: int, seed: int) -> LoraWeights:
    """Rank-`rank` pairs on every fused part of every adaptable Linear (as a PEFT all-linear adapter)."""
    g = torch.Generator().manual_seed(seed)
    weights = LoraWeights()
    for name, linear in engine.lora.targets.modules.items():
        for part in linear.part_names:
            start, size = linear.part_range(part)
            a = torch.randn(rank, linear.in_features, generator=g) * 0.01
            b = torch.randn(size, rank, generator=g) * 0.01
            weights.add(name, LoraPair(start, size, a.to(engine.dtype), b.to(engine.dtype)))
    return weights


def make_inputs(batch: int, tokens: int, context: int, block_size: int, slots: list[int]) -> list[StepInput]:
    """`batch` sequences each computing `tokens` new tokens after `context - tokens` cached ones."""
    row = SamplingRow(options=SamplingOptions(temperature=0.0), prompt_token_ids=[1], output_token_ids=[],
                      generator=None, eos_token_ids=[])
    blocks = -(-context // block_size)
    return [
        StepInput(token_ids=[(7 * i + j) % 100 + 3 for j in range(tokens)], start_pos=context - tokens,
                  block_table=list(range(i * blocks, (i + 1) * blocks)), sample_rows=[row],
                  adapter_slot=slots[i % len(slots)] if slots else -1)
        for i in range(batch)
    ]


def time_steps(engine: NativeEngine, cases: list[list[StepInput]], warmup: int, iters: int) -> list[float]:
    """Median seconds of one ModelRunner.execute per input set; the sets alternate, so drift in the
    machine's load (other processes, clocks) hits every set alike."""
    cuda = engine.device.type == "cuda"
    times: list[list[float]] = [[] for _ in cases]
    for i in range(warmup + iters):
        order = range(len(cases)) if i % 2 else reversed(range(len(cases)))
        for c in order:
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            engine.runner.execute(cases[c])
            if cuda:
                torch.cuda.synchronize()
            if i >= warmup:
                times[c].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


@torch.inference_mode()
def time_graph(engine: NativeEngine, inputs: list[StepInput], iters: int) -> float:
    """Seconds per replay of the model's forward over `inputs` captured in a CUDA graph: the GPU cost
    without Python and launch overhead (what CUDA-graph decoding will pay)."""
    runner = engine.runner
    input_ids, positions, meta = runner.prepare(inputs)
    runner.lora.set([len(i.token_ids) for i in inputs], [i.adapter_slot for i in inputs])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            runner.model(input_ids, positions, runner.kv_caches, meta)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        runner.model(input_ids, positions, runner.kv_caches, meta)
    return ms_per_call(graph.replay, iters, warmup=1) / 1e3


def replayed(engine: NativeEngine, inputs: list[StepInput]) -> str:
    """How ModelRunner.execute runs `inputs`: from the engine's CUDA graphs or eagerly."""
    graphs = engine.runner.graphs
    return "graph" if graphs is not None and graphs.accepts(StepInputs.of(inputs)) else "eager"


def profile_step(engine: NativeEngine, base_in: list[StepInput], lora_in: list[StepInput]) -> None:
    """Where a step's time goes, without and with adapters: the top operators by host and by device time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.device.type == "cuda" else [])
    for name, inputs in (("base", base_in), ("8 adapters", lora_in)):
        with profile(activities=activities) as prof:
            for _ in range(3):
                engine.runner.execute(inputs)
            if engine.device.type == "cuda":
                torch.cuda.synchronize()
        for key in ("self_cpu_time_total",) + (("self_device_time_total",) if len(activities) > 1 else ()):
            print(f"--- {name}: 3 steps, top operators by {key}")
            print(prof.key_averages().table(sort_by=key, row_limit=12, max_name_column_width=48))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the demo model)")
    parser.add_argument("--synthetic", choices=sorted(SYNTHETIC), default=None,
                        help="benchmark a random-weight Llama of this shape instead of --model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--max-lora-rank", type=int, default=0,
                        help="slot capacity per projection (the server's --max-lora-rank; 0: --rank)")
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--context", type=int, default=128, help="tokens per sequence in decode steps")
    parser.add_argument("--prefill", type=int, default=512, help="tokens of the prefill step (0: skip)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: the engine's default)")
    parser.add_argument("--graph", action="store_true", help="CUDA: also time decode forwards as CUDA graphs")
    parser.add_argument("--profile", action="store_true", help="torch.profiler tables of the prefill step")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    if args.synthetic:
        import tempfile

        args.model = synthetic_model(args.synthetic, Path(tempfile.mkdtemp(prefix="lora-bench-")), args.device)
    biggest = max(args.batch) * args.context + args.prefill + 64
    config = EngineConfig(model=args.model, device=args.device, dtype=args.dtype, max_loras=args.adapters,
                          tokenizer=demo_model_path() if args.synthetic else None,
                          max_model_len=max(args.context, args.prefill) + 16,
                          max_lora_rank=args.max_lora_rank or args.rank, max_kv_tokens=biggest, kv_block_size=16,
                          cpu_threads=args.threads or None)
    engine = NativeEngine(config)
    engine.load()
    for key in range(args.adapters):
        engine.lora.slots.acquire(key + 1, random_adapter(engine, args.rank, seed=key))
    slots = list(range(args.adapters))
    bs = config.kv_block_size

    cases = [(f"decode batch {b}, context {args.context}", b, 1, args.context) for b in args.batch]
    if args.prefill:
        per_seq = max(1, args.prefill // args.adapters)
        cases.append((f"prefill {args.adapters} x {per_seq} tokens", args.adapters, per_seq, per_seq))
    results = []
    print(f"model {engine.model_path} ({engine.dtype}, {engine.device}), {args.adapters} adapters of rank "
          f"{args.rank} on every projection in slots of rank {config.max_lora_rank}; median of {args.iters} steps")
    adapters = f"{args.adapters} adapters ms"
    print(f"{'step':<64} {'base ms':>9} {adapters:>15} {'ratio':>6}")
    for label, batch, tokens, context in cases:
        base_in = make_inputs(batch, tokens, context, bs, [])
        lora_in = make_inputs(batch, tokens, context, bs, slots)
        base, lora = time_steps(engine, [base_in, lora_in], args.warmup, args.iters)
        how = f" (execute: {replayed(engine, base_in)} / {replayed(engine, lora_in)})" if args.device != "cpu" else ""
        rows = [(label + how, base, lora)]
        if args.graph and tokens == 1 and engine.device.type == "cuda":
            rows.append((label + " (CUDA graph)", time_graph(engine, base_in, args.iters),
                         time_graph(engine, lora_in, args.iters)))
        if args.profile and tokens > 1:
            profile_step(engine, base_in, lora_in)
        for name, b, a in rows:
            results.append({"step": name, "batch": batch, "new_tokens_per_seq": tokens, "base_ms": b * 1e3,
                            "lora_ms": a * 1e3, "ratio": a / b})
            print(f"{name:<64} {b * 1e3:>9.2f} {a * 1e3:>15.2f} {a / b:>6.2f}")
    if args.json is not None:
        meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "machine": platform.platform(),
                "processor": platform.processor(), "torch": torch.__version__,
                "args": {**vars(args), "json": str(args.json)}}
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2))


if __name__ == "__main__":
    main()
