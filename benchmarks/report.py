"""Presenting results: rich tables on the terminal, JSON files, and latency-vs-throughput PNG plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

_LATENCIES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E"),
              ("gap_ms", "Client turnover"))  # turnover: closed loops only


def _ms(d: dict[str, float] | None, key: str) -> str:
    return "-" if not d else f"{d[key]:.2f}"


def print_summary(console: Console, s: dict[str, Any], title: str) -> None:
    """One run: throughput lines and a latency table (mean, p50, p90, p99 in ms)."""
    t = Table(title=title, title_justify="left")
    t.add_column("metric")
    for col in ("mean", "p50", "p90", "p99"):
        t.add_column(col, justify="right")
    for key, name in _LATENCIES:
        t.add_row(f"{name} (ms)", *(_ms(s[key], c) for c in ("mean", "p50", "p90", "p99")))
    console.print(t)
    line = (
        f"requests {s['completed']}/{s['requests']} ok, {s['failed']} failed in {s['duration_s']:.2f} s | "
        f"{s['request_throughput']:.2f} req/s | {s['output_token_throughput']:.1f} output tok/s | "
        f"{s['total_token_throughput']:.1f} total tok/s | {s['events_per_s']:.1f} events/s | "
        f"mean tokens in/out {s['mean_prompt_tokens']:.1f}/{s['mean_output_tokens']:.1f}"
    )
    if "goodput" in s:
        line += f" | goodput {s['goodput']['request_throughput']:.2f} req/s {s['goodput']['targets_ms']}"
    console.print(line)
    for err, n in s["errors"].items():
        console.print(f"[red]{n} x {err}[/red]")


def print_sweep(console: Console, points: list[dict[str, Any]], key: str, title: str) -> None:
    """A sweep: one row per concurrency (or rate)."""
    t = Table(title=title, title_justify="left")
    for col in (key, "req/s", "out tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "ITL p50", "E2E p50", "E2E p99", "failed"):
        t.add_column(col, justify="right")
    for p in points:
        s = p["summary"]
        t.add_row(
            str(p[key]),
            f"{s['request_throughput']:.2f}",
            f"{s['output_token_throughput']:.1f}",
            _ms(s["ttft_ms"], "p50"),
            _ms(s["ttft_ms"], "p99"),
            _ms(s["tpot_ms"], "p50"),
            _ms(s["itl_ms"], "p50"),
            _ms(s["e2e_ms"], "p50"),
            _ms(s["e2e_ms"], "p99"),
            str(s["failed"]),
        )
    console.print(t)


def write_json(path: str | Path, payload: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


def _pyplot() -> Any:
    """matplotlib.pyplot on the file-only backend (imported late: only plots need it)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: str | Path) -> Path:
    """Lay out, write `fig` as a PNG at `path` (creating its folder) and free it."""
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def plot_sweep(points: list[dict[str, Any]], key: str, path: str | Path, title: str) -> Path:
    """Latency (p50 and p99 of TTFT, TPOT, ITL, E2E) against output token throughput, one PNG."""
    fig, axes = _pyplot().subplots(2, 2, figsize=(11, 8))
    xs = [p["summary"]["output_token_throughput"] for p in points]
    for ax, (metric, name) in zip(axes.flat, _LATENCIES):
        for pct, style in (("p50", "o-"), ("p99", "s--")):
            ys = [p["summary"][metric][pct] if p["summary"][metric] else float("nan") for p in points]
            ax.plot(xs, ys, style, label=pct)
        for x, p in zip(xs, points):
            d = p["summary"][metric]
            if d:
                ax.annotate(f"{key[0]}={p[key]}", (x, d["p50"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_title(f"{name} vs throughput")
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(f"{name} (ms)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    return _save(fig, path)


def plot_throughput_by_concurrency(series: dict[str, dict[int, float]], baseline: tuple[str, float] | None,
                                   path: str | Path, title: str) -> Path:
    """Output tokens/s against concurrency, one line per server (and a flat baseline line), one PNG."""
    fig, ax = _pyplot().subplots(figsize=(8, 5))
    for label, points in series.items():
        cs = sorted(points)
        ax.plot(cs, [points[c] for c in cs], "o-", label=label)
        for c in cs:
            ax.annotate(f"{points[c]:.0f}", (c, points[c]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if baseline:
        ax.axhline(baseline[1], linestyle="--", color="grey", label=baseline[0])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("output tokens/s")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def markdown_table(columns: list[str], rows: list[list[str]]) -> str:
    """A Markdown table (RESULTS.md sections)."""
    return "\n".join(["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
                      *("| " + " | ".join(r) + " |" for r in rows)])


def append_section(path: Path, section: str, console: Console) -> None:
    """Append a dated section to RESULTS.md, and say so."""
    with path.open("a") as f:
        f.write(section)
    console.print(f"appended to {path}")
