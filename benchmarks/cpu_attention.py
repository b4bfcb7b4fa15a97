"""CPU decode attention: the C++ kernel (runtime/native/cpu/paged_attention.py) against the reference backend (a gather
of each row's blocks, then SDPA), one layer's call of a decode step, in one run.

    python -m benchmarks.cpu_attention                      # SmolLM2-135M's shape, bf16, context 256
    python -m benchmarks.cpu_attention --append-results     # also a dated section in RESULTS.md

Rows are sequences of one decode step, each `--context` tokens long, their blocks scattered over a cache far
larger than the CPU's L2 (as after a while of serving). Microseconds per layer are medians over `--calls`
calls, interleaving the two backends; the step figure multiplies by the model's layer count. One torch thread,
as the engine uses on the 2-core box.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
from rich.console import Console

from benchmarks.overhead import RESULTS_MD, _commit, _machine
from benchmarks.report import append_section, markdown_table
from runtime.native.attention_metadata import AttentionMetadata, pad_block_tables
from runtime.native.cpu.paged_attention import build_kernel, cpu_paged_attention
from runtime.native.models.attention import torch_paged_attention


def decode_step(lengths: list[int], heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                block_size: int = 16, spare_blocks: int = 8, seed: int = 0):
    """q/k/v of one decode step over rows of `lengths` tokens, a cache with `spare_blocks` more blocks than they
    use, each row's blocks drawn at random from it, and the step's metadata."""
    gen = torch.Generator().manual_seed(seed)
    blocks = sum(-(-n // block_size) for n in lengths) + spare_blocks
    cache = torch.randn(2, blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    free = torch.randperm(blocks, generator=gen).tolist()
    tables = [[free.pop() for _ in range(-(-n // block_size))] for n in lengths]
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    last = [t[(n - 1) // block_size] * block_size + (n - 1) % block_size for t, n in zip(tables, lengths)]
    meta = AttentionMetadata(
        query_start_loc=torch.arange(len(lengths) + 1, dtype=torch.int32), context_lens=seq_lens - 1,
        seq_lens=seq_lens, block_tables=pad_block_tables(tables), slot_mapping=torch.tensor(last),
        block_size=block_size, max_query_len=1, max_seq_len=max(lengths), query_lens_host=[1] * len(lengths),
        seq_lens_host=list(lengths),
    )
    q = torch.randn(len(lengths), heads, head_dim, generator=gen).to(dtype)
    k, v = (torch.randn(len(lengths), kv_heads, head_dim, generator=gen).to(dtype) for _ in range(2))
    return q, k, v, cache, meta


def measure(rows: int, args: argparse.Namespace) -> dict[str, float]:
    dtype = getattr(torch, args.dtype)
    q, k, v, cache, meta = decode_step([args.context] * rows, args.heads, args.kv_heads, args.head_dim, dtype,
                                       spare_blocks=args.spare_blocks)
    scale = args.head_dim**-0.5
    times: dict[str, list[float]] = {"reference": [], "kernel": []}
    for _ in range(args.calls):
        for name, backend in (("reference", torch_paged_attention), ("kernel", cpu_paged_attention)):
            meta.derived.clear()  # the reference's per-step inputs, made once per step in the engine: counted here
            start = time.perf_counter()
            backend(q, k, v, cache, meta, scale)
            times[name].append(time.perf_counter() - start)
    ref, ker = (statistics.median(times[n]) * 1e6 for n in ("reference", "kernel"))
    return {"rows": rows, "reference_us": ref, "kernel_us": ker, "speedup": ref / ker,
            "step_ms_saved": (ref - ker) * args.layers / 1e3}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cpu_attention", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1,16,32", help="decode rows (sequences) per step, comma list")
    p.add_argument("--context", type=int, default=256, help="tokens per row")
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=30, help="layers per step (SmolLM2-135M: 30)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--spare-blocks", type=int, default=4096, help="unused cache blocks (4096: 25 MB in bf16)")
    p.add_argument("--append-results", action="store_true")
    args = p.parse_args(argv)
    console = Console(stderr=True)
    if not build_kernel():
        console.print("[red]the kernel did not build (see the warning above)[/red]")
        return 1
    results = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for rows in map(int, args.rows.split(",")):
            console.print(f"[dim]{rows} rows x {args.context} tokens, {args.calls} calls per backend[/dim]")
            results.append(measure(rows, args))
    finally:
        torch.set_num_threads(threads)  # process-wide: a caller in the same process (the smoke test) keeps its own
    table = markdown_table(
        ["rows", "gather + SDPA us/layer", "kernel us/layer", "speed-up", f"ms saved per {args.layers}-layer step"],
        [[str(r["rows"]), f"{r['reference_us']:.0f}", f"{r['kernel_us']:.0f}", f"{r['speedup']:.2f}x",
          f"{r['step_ms_saved']:.1f}"] for r in results])
    print(table)
    if args.append_results:
        shape = f"{args.heads} heads / {args.kv_heads} KV heads x {args.head_dim}, {args.dtype}"
        section = (f"## {time.strftime('%Y-%m-%d %H:%M')} CPU decode attention: C++ kernel vs gather + SDPA\n\n"
                   f"- machine: {_machine()}; 1 torch thread\n- commit: {_commit()}\n"
                   f"- command: `python -m benchmarks.cpu_attention {shlex.join(sys.argv[1:])}`\n"
                   f"- shape: {shape}, {args.context} tokens per row, blocks scattered over a "
                   f"{args.spare_blocks}-block cache; medians of {args.calls} interleaved calls\n\n{table}\n")
        append_section(Path(RESULTS_MD), section, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
