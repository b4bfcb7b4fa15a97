"""The README's headline plot, from figures recorded in benchmarks/RESULTS.md (copied here, with their sections).

    python -m benchmarks.plot_headline            # writes docs/headline.png

Left: the default model on the 2-core CPU box, output tokens/s by concurrency, ours against llama.cpp's
`llama-server` on the same GGUF file in the same run. Right: the time of a batch-1 decode step on an H200 against
the floor of reading the weights once at the measured copy bandwidth.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

# "2026-11-26 14:56 SmolLM2-135M-Instruct.Q4_1 on CPU: ours vs generate vs transformers serve vs llama.cpp"
CPU_CONCURRENCY = [1, 16, 32]
CPU_TOK_S = {
    "ours, bf16 + int4": [49, 184, 258],
    "ours, bf16": [18, 178, 263],
    "llama.cpp, BF16": [38, 108, 143],
    "llama.cpp, Q4_1": [53, 86, 154],
}

# model shape: (step ms, floor ms). Llama-3.2-1B: "2026-11-27 13:05-14:10 the step as columns" (through the engine
# core); the 8B shapes: "2026-11-28 issue 43's families on the H200"; Qwen3-30B-A3B: the graphed step of
# "2026-11-29 08:30-09:05 UTC: Qwen3-30B-A3B batch 1" (random bf16 weights).
H200_BATCH1_MS = {
    "Llama-3.2-1B": (1.069, 0.602),
    "Llama-3.1-8B": (4.07, 3.62),
    "Qwen3-8B": (4.27, 3.66),
    "Qwen3-30B-A3B": (2.541, 1.454),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "headline.png")
    args = parser.parse_args(argv)
    fig, (cpu, gpu) = plt.subplots(1, 2, figsize=(11, 4))
    for label, tok_s in CPU_TOK_S.items():
        style = "-" if label.startswith("ours") else "--"
        cpu.plot(CPU_CONCURRENCY, tok_s, style, marker="o", label=label)
    cpu.set(xlabel="concurrent streams", ylabel="output tokens/s", xticks=CPU_CONCURRENCY, ylim=(0, None),
            title="SmolLM2-135M-Instruct, 2-core CPU")
    cpu.legend()
    names = list(H200_BATCH1_MS)
    steps = [H200_BATCH1_MS[n][0] for n in names]
    floors = [H200_BATCH1_MS[n][1] for n in names]
    positions = range(len(names))
    gpu.bar([p - 0.2 for p in positions], steps, width=0.4, label="decode step")
    gpu.bar([p + 0.2 for p in positions], floors, width=0.4, label="floor (weights read once)")
    for p, step, floor in zip(positions, steps, floors):
        gpu.annotate(f"{step / floor:.1f}x floor", (p - 0.2, step), ha="center", va="bottom")
    gpu.set(ylabel="ms a token, one stream", title="batch-1 decode on an H200, bf16", ylim=(0, 1.35 * max(steps)))
    gpu.set_xticks(list(positions), names)
    gpu.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
