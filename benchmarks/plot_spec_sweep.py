"""Plot of a speculative-decoding sweep: speedup and acceptance against the number of draft tokens K.

    python -m benchmarks.plot_spec_sweep benchmarks/results/spec-decode-h100-wide1b-c1-k*-20261123.json \
        --out benchmarks/results/spec-decode-h100-wide1b-k-sweep-20261123.png

Reads `benchmarks.spec_decode --json` files (one per K, same concurrency) and draws, per mode, the speedup over
the run's own `none` baseline (left) and the acceptance rate (right), with the 1.5x / 0.6 lines of issue 7.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(paths: list[Path]) -> dict[str, list[tuple[int, float, float]]]:
    """mode -> [(K, speedup, acceptance)] sorted by K."""
    series: dict[str, list[tuple[int, float, float]]] = {}
    for path in paths:
        data = json.loads(path.read_text())
        k = int(data["meta"]["args"]["num_draft_tokens"])
        for row in data["rows"]:
            if row["mode"] != "none":
                series.setdefault(row["mode"], []).append((k, row["speedup"], row["acceptance_rate"]))
    return {mode: sorted(points) for mode, points in series.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--title", default="speculative decoding, one stream: the 0.98B widened demo target on an H100")
    args = parser.parse_args(argv)
    series = load(args.files)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for mode, points in series.items():
        ks = [p[0] for p in points]
        left.plot(ks, [p[1] for p in points], marker="o", label=mode)
        right.plot(ks, [p[2] for p in points], marker="o", label=mode)
    ks = sorted({p[0] for points in series.values() for p in points})
    for ax in (left, right):
        ax.set_xticks(ks)
    left.axhline(1.5, color="grey", linestyle="--", linewidth=1)
    left.axhline(1.0, color="black", linewidth=0.5)
    right.axhline(0.6, color="grey", linestyle="--", linewidth=1)
    left.set(xlabel="draft tokens K", ylabel="tokens/s vs no speculation (x)", ylim=(0, None))
    right.set(xlabel="draft tokens K", ylabel="acceptance rate", ylim=(0, 1))
    left.legend()
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
