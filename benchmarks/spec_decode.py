"""Speculative decoding benchmark: decode tokens/s with and without speculation, in-process (no HTTP).

    python -m benchmarks.spec_decode                      # the embedded demo pair on CPU
    python -m benchmarks.spec_decode --model DIR --draft-model DIR --device cuda --max-tokens 256
    python -m benchmarks.spec_decode --model default --draft-layers 4 --dtype bfloat16 --modes none draft
    python -m benchmarks.spec_decode --model default --prompts chat --dtype float32   # the shipped distilled draft
    python -m benchmarks.spec_decode --model default --prompts chat --dtype float32 --modes none draft eagle

For each concurrency (default 1 and 8) runs the same greedy requests (ignore_eos, fixed length) with
--speculative none, draft and ngram (and eagle: the shipped head, or --eagle-head DIR); reports completion tokens/s,
the speedup over `none` measured in the same run (a ratio of tokens per second), the acceptance rate and mean
accepted drafts per step, and whether every output equals the non-speculative one (greedy speculation must be
exact). `--json FILE` writes the table.
`--draft-layers N` drafts with the target's own first N layers, final norm and head (an early-exit draft,
no training: the cheapest draft any Llama-family checkpoint gives). `--repeat R` runs R rounds of all modes
(every other round in reverse order) and reports medians, each round's ratio being paired with that round's
baseline; the `cpu` column is the same ratio in tokens per CPU-second of this process, the
steadier figure on a machine shared with other work. Greedy outputs are bit-exact in float32 on the CPU; in
bf16 the K+1-token verify forward rounds differently from one-token decode steps, so near-tied logits may
pick the other token (the demo's shipped dtype is bf16: pass --dtype float32 for the exactness check), except on
CUDA where a verification's rows run one-token steps' GEMV kernels (docs/speculative_decoding.md, Exactness). On
CUDA even float32 ids depend on the batch's shape at near ties, with or without speculation (cuBLAS picks its
kernels by the number of rows: the same greedy requests one at a time and eight at once part there), so
`exact` can read NO on a GPU when nothing is wrong.
`--prompts chat`: held-out chat prompts of tools/demo_training/train_default_draft.py through the target's chat
template, each answer ending at its end of turn (code prompts: fixed length, ignore_eos).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import platform
import pstats
import statistics
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from runtime.config import EngineConfig
from runtime.native.llm_engine import NativeEngine
from runtime.request import GenerationRequest, SamplingOptions
from runtime.native.speculative.draft import DraftProposer

# Code prompts: the demo model was trained on Python's standard library.
PROMPTS = [
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main():\n",
    "class Stack:\n    def __init__(self):\n",
    "def read_lines(path):\n    with open(path) as f:\n",
    "    for key, value in items.items():\n",
    "def _check_arg(name, value):\n    if not isinstance(value, str):\n",
    "import re\n\n_pattern = re.compile(",
    "class Error(Exception):\n    \"\"\"Base class for exceptions in this module.\"\"\"\n",
]


def early_exit_draft(model_dir: str, layers: int, out: Path) -> str:
    """A checkpoint folder holding the first `layers` decoder layers of `model_dir` with its embedding, final norm,
    head and tokenizer files: a draft that shares the target's weights and tokenizer."""
    import shutil

    from safetensors.torch import load_file, save_file

    from runtime.native.models.loader import checkpoint_files

    src = Path(model_dir)
    tensors = {}
    for file in checkpoint_files(src):
        for name, tensor in load_file(file).items():
            parts = name.split(".")
            if "layers" in parts and int(parts[parts.index("layers") + 1]) >= layers:
                continue
            tensors[name] = tensor
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}))
    for extra in src.iterdir():
        if extra.suffix != ".safetensors" and extra.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy(extra, out / extra.name)
    return str(out)


@dataclass
class Row:
    mode: str
    concurrency: int
    requests: int
    completion_tokens: int
    seconds: float  # median over --repeat rounds
    tokens_per_s: float  # median over the rounds
    # median of each round's ratio of tokens per second to that round's `none` run (paired: robust to load drifts);
    # tokens, not seconds: bf16 chat answers of a mode that is not exact can end elsewhere than `none`'s (n-gram's ran
    # 844 tokens against 641 on the H200, 2026-11-29: 0.59x by seconds for 0.78x the rate)
    speedup: float
    cpu_speedup: float  # the same ratio in tokens per CPU-second of this process (less sensitive to other load)
    acceptance_rate: float | None
    mean_accepted_per_step: float | None
    outputs_equal_baseline: bool | None
    # diagnostics, summed over the rounds: engine steps, of them op by op (target), the draft model's op-by-op
    # steps (a catch-up longer than a graph takes), and the guard's last (plain, speculating) tokens/s per number
    # of decoding sequences in the last round
    steps: int = 0
    eager_steps: int = 0
    draft_eager_steps: int = 0
    guard_tokens_per_s: dict[int, tuple[float, float]] | None = None


@dataclass
class Run:
    """One timed pass of one mode: wall and process-CPU seconds, outputs, speculation counter deltas."""

    seconds: float
    cpu_seconds: float
    tokens: int
    outputs: list[list[int]]
    spec: tuple[int, int, int]  # drafts proposed, accepted, sequence-steps
    steps: tuple[int, int, int]  # engine steps, of them op by op, the draft model's op-by-op steps
    guard: dict[int, tuple[float, float]] | None  # SpeculationGuard.tokens_per_s by decoding sequences


def chat_prompts(model_dir: str, count: int = 16) -> list[str]:
    """The first `count` held-out prompts of the default draft's training script, rendered by the chat template."""
    from tools.demo_training.train_default_draft import prompt_pool
    from runtime.tokenizer import Tokenizer

    hf = Tokenizer.from_pretrained(model_dir).hf
    return [hf.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            for p in prompt_pool()[1][:count]]


async def run_mode(config: EngineConfig, concurrency: int, num_requests: int, max_tokens: int,
                   prompts: list[str], ignore_eos: bool, profile: Path | None = None) -> Run:
    engine = NativeEngine(config)
    await engine.start()
    try:
        async def one(i: int) -> list[int]:
            req = GenerationRequest(f"r{i}", prompt=prompts[i % len(prompts)], add_special_tokens=ignore_eos,
                                    sampling=SamplingOptions(max_tokens=max_tokens, temperature=0.0,
                                                             ignore_eos=ignore_eos))
            tokens: list[int] = []
            async for d in engine.generate(req):
                tokens.extend(d.token_ids)
            return tokens

        # warm-up at the timed concurrency, not timed: first-use kernel compilation for the batched shapes
        # (seen on the H100, 2026-11-23 15:32) otherwise lands in whichever mode runs first
        await asyncio.gather(*(one(i) for i in range(concurrency)))
        before, draft_before = engine.stats(), _draft_eager_steps(engine)
        sem = asyncio.Semaphore(concurrency)

        async def gated(i: int) -> list[int]:
            async with sem:
                return await one(i)

        # the engine's steps, profiled in its step thread (where a profiler is enabled; Python 3.12's also records
        # the other threads while a step runs)
        if profile is not None:
            profiler, step = cProfile.Profile(), engine.step
            engine.step = lambda: profiler.runcall(step)  # type: ignore[method-assign]
        start, cpu_start = time.perf_counter(), time.process_time()
        outs = await asyncio.gather(*(gated(i) for i in range(num_requests)))
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
        if profile is not None:
            engine.step = step  # type: ignore[method-assign]
            _write_profile(profiler, profile)
        after, draft_after = engine.stats(), _draft_eager_steps(engine)
        guard = engine.speculator.guard if engine.speculator is not None else None
        rates = {d: r for d in range(1, concurrency + 1)
                 if guard is not None and (r := guard.tokens_per_s(d)) is not None} or None
    finally:
        await engine.shutdown()
    spec = (after.spec_draft_tokens - before.spec_draft_tokens, after.spec_accepted_tokens - before.spec_accepted_tokens,
            after.spec_steps - before.spec_steps)
    steps = (after.iterations - before.iterations, after.eager_iterations - before.eager_iterations,
             draft_after - draft_before)
    return Run(seconds, cpu_seconds, sum(map(len, outs)), outs, spec, steps, rates)


def _write_profile(profiler: cProfile.Profile, out: Path) -> None:
    """The timed window's engine steps on the host: the top functions by own and by total time."""
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    for order in ("tottime", "cumulative"):
        stats.sort_stats(order).print_stats(45)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text.getvalue())


def _draft_eager_steps(engine: NativeEngine) -> int:
    spec = engine.speculator
    return spec.proposer.runner.eager_steps if spec is not None and isinstance(spec.proposer, DraftProposer) else 0


async def bench(args: argparse.Namespace) -> list[Row]:
    rows: list[Row] = []
    for concurrency in args.concurrency:
        num_requests = max(args.requests_per_slot * concurrency, concurrency)
        runs: dict[str, list[Run]] = {}
        for round_ in range(args.repeat):
            # modes alternate within each round, so a load drift hits all of them, and every other round runs them in
            # reverse: each engine runs in the same process after the others, and a fixed order favoured the first
            # (H200, 2026-11-27: 0.98-1.00x at c=8 in steps where nothing speculated)
            for mode in args.modes if round_ % 2 == 0 else args.modes[::-1]:
                config = EngineConfig(model=args.model, device=args.device, dtype=args.dtype, seed=0,
                                      max_batch_size=max(8, concurrency), speculative=mode,
                                      draft_model={"draft": args.draft_model, "eagle": args.eagle_head}.get(mode),
                                      num_draft_tokens=args.num_draft_tokens, ngram_min=args.ngram_min,
                                      ngram_max=args.ngram_max, max_kv_tokens=args.max_kv_tokens,
                                      speculative_max_concurrency=args.speculative_max_concurrency,
                                      speculative_guard=args.speculative_guard)
                profile = args.profile / f"profile_{mode}_c{concurrency}.txt" if args.profile and round_ == 0 else None
                runs.setdefault(mode, []).append(await run_mode(config, concurrency, num_requests, args.max_tokens,
                                                                args.prompt_texts, args.prompts == "code", profile))
        base = runs["none"]
        for mode, mode_runs in runs.items():
            proposed, accepted, steps = (sum(r.spec[i] for r in mode_runs) for i in range(3))
            tokens = mode_runs[0].tokens  # chat answers end at their end of turn: the same count only where exact
            rows.append(Row(
                mode=mode, concurrency=concurrency, requests=num_requests, completion_tokens=tokens,
                seconds=round(statistics.median(r.seconds for r in mode_runs), 3),
                tokens_per_s=round(statistics.median(tokens / r.seconds for r in mode_runs), 1),
                speedup=round(statistics.median(r.tokens * b.seconds / (b.tokens * r.seconds)
                                                for r, b in zip(mode_runs, base)), 2),
                cpu_speedup=round(statistics.median(r.tokens * b.cpu_seconds / (b.tokens * r.cpu_seconds)
                                                    for r, b in zip(mode_runs, base)), 2),
                acceptance_rate=round(accepted / proposed, 3) if proposed else None,
                mean_accepted_per_step=round(accepted / steps, 2) if steps else None,
                outputs_equal_baseline=None if mode == "none" else all(r.outputs == base[0].outputs for r in mode_runs),
                steps=sum(r.steps[0] for r in mode_runs), eager_steps=sum(r.steps[1] for r in mode_runs),
                draft_eager_steps=sum(r.steps[2] for r in mode_runs), guard_tokens_per_s=mode_runs[-1].guard,
            ))
            print(json.dumps(asdict(rows[-1])), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="demo", help="target checkpoint (default: the embedded demo model; `default`: the server's default model)")
    p.add_argument("--draft-model", default=None,
                   help="draft checkpoint (default: the demo's draft, or the default model's distilled one)")
    p.add_argument("--prompts", default="code", choices=["code", "chat"],
                   help="code: fixed-length code completions; chat: held-out chat prompts, answers end at end of turn")
    p.add_argument("--draft-layers", type=int, default=None, help="draft with the target's first N layers (no training)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--modes", nargs="+", default=["none", "draft", "ngram"], choices=["none", "draft", "ngram", "eagle"])
    p.add_argument("--eagle-head", default=None,
                   help="EAGLE head folder for --modes eagle (default: the default model's shipped one)")
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 8])
    p.add_argument("--requests-per-slot", type=int, default=2, help="requests = this x concurrency")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--num-draft-tokens", type=int, default=EngineConfig.num_draft_tokens)
    p.add_argument("--ngram-min", type=int, default=1)
    p.add_argument("--ngram-max", type=int, default=4)
    p.add_argument("--max-kv-tokens", type=int, default=16384)
    p.add_argument("--speculative-max-concurrency", type=int, default=EngineConfig.speculative_max_concurrency,
                   help="no speculation in steps where more sequences decode (the server's option and default)")
    p.add_argument("--speculative-guard", default=EngineConfig.speculative_guard, action=argparse.BooleanOptionalAction,
                   help="stop speculating where measured steps show it slower (the server's option and default)")
    p.add_argument("--repeat", type=int, default=1, help="rounds of all modes; medians are reported")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--profile", type=Path, default=None,
                   help="folder: the first round's timed window of each mode under cProfile (slower: for where the "
                        "host's time goes, not for the figures)")
    args = p.parse_args(argv)
    if args.modes[0] != "none":
        args.modes = ["none"] + [m for m in args.modes if m != "none"]  # the baseline runs first
    from runtime.default_model import resolve_model

    folder = resolve_model(None if args.model == "default" else args.model, args.dtype)[0]
    args.prompt_texts = PROMPTS if args.prompts == "code" else chat_prompts(folder)
    with tempfile.TemporaryDirectory() as tmp:
        if args.draft_layers is not None:
            args.draft_model = early_exit_draft(folder, args.draft_layers, Path(tmp) / "draft")
        elif args.model == "default" and args.draft_model is None:
            from runtime.demo import default_draft_path

            args.draft_model = default_draft_path(folder)
        if args.model == "default":
            from runtime.demo import DEFAULT_EAGLE_DIR

            args.model = folder
            args.eagle_head = args.eagle_head or str(DEFAULT_EAGLE_DIR)
        rows = asyncio.run(bench(args))
    print(f"\n{'mode':6} {'conc':>4} {'tok/s':>8} {'speedup':>7} {'cpu':>6} {'accept':>6} {'acc/step':>8} {'exact':>5}")
    for r in rows:
        acc = "-" if r.acceptance_rate is None else f"{r.acceptance_rate:.2f}"
        per = "-" if r.mean_accepted_per_step is None else f"{r.mean_accepted_per_step:.2f}"
        exact = "-" if r.outputs_equal_baseline is None else ("yes" if r.outputs_equal_baseline else "NO")
        print(f"{r.mode:6} {r.concurrency:>4} {r.tokens_per_s:>8.1f} {r.speedup:>6.2f}x {r.cpu_speedup:>5.2f}x "
              f"{acc:>6} {per:>8} {exact:>5}")
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.platform(),
                "processor": platform.processor(), "commit": commit,
                "args": {k: str(v) for k, v in vars(args).items() if k != "prompt_texts"}}
        args.json.write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2))


if __name__ == "__main__":
    main()
