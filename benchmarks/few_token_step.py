"""A decode-shaped step of T one-token rows (a batch of T sequences, or one sequence's verification rows) against a
one-row step, with the projections as GEMVs of T tokens (runtime/native/cuda/gemv.py) and through cuBLAS, on a GPU
(issue 46: verification at the cost of a decode step). Device time of CUDA-graph replays of the model's forward and
its logits, on a random checkpoint of the given shape (bf16).

    python -m benchmarks.few_token_step --shape smollm2 --out /tmp/fts      # on the GPU
    python -m benchmarks.few_token_step --smoke --out /tmp/fts              # the same code in seconds, CPU
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchmarks.cuda_timing import HostEvent, cuda_event, ms_per_call
from benchmarks.gpu_models import LLAMA_1B, SMOLLM2_135M, TINY, make_checkpoint
from runtime.native.attention_metadata import AttentionMetadata
from runtime.native.models import load_model

SHAPES = {"smollm2": SMOLLM2_135M, "1b": LLAMA_1B, "tiny": TINY}
BLOCK = 16


def blocks_per_row(context: int) -> int:
    """KV blocks of a row after `context` cached tokens (and its own)."""
    return -(-(context + 1) // BLOCK)


def rows_meta(rows: int, context: int, device: torch.device) -> AttentionMetadata:
    """`rows` one-token rows, each its own sequence of `context` cached tokens and its own blocks."""
    blocks = blocks_per_row(context)
    tables = torch.arange(rows * blocks, dtype=torch.int32, device=device).view(rows, blocks)
    slots = tables[:, context // BLOCK].long() * BLOCK + context % BLOCK
    lens = torch.full((rows,), context + 1, dtype=torch.int32, device=device)
    return AttentionMetadata(torch.arange(rows + 1, dtype=torch.int32, device=device), lens - 1, lens, tables, slots,
                             BLOCK, 1, context + 1, [1] * rows, [context + 1] * rows)


def step_ms(model: torch.nn.Module, rows: int, context: int, caches: list[torch.Tensor], device: torch.device,
            graphs: bool) -> float:
    ids = torch.randint(0, 500, (rows,), device=device)  # below every shape's vocabulary
    positions = torch.full((rows,), context, device=device)
    meta = rows_meta(rows, context, device)

    def forward() -> None:
        model.compute_logits(model.model(ids, positions, caches, meta))

    with torch.inference_mode():
        forward()
        if not graphs:
            return ms_per_call(forward, calls=3, rounds=3, warmup=1, event=HostEvent)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            forward()
        return ms_per_call(graph.replay, calls=50, rounds=5, warmup=5, event=cuda_event)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=list(SHAPES), default="smollm2")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--work", type=Path, default=Path("/tmp/few_token_step"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true",
                        help="the tiny shape on the CPU, op by op (timings mean nothing)")
    args = parser.parse_args()
    from runtime.native.cuda import fused

    device = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    shape = TINY if args.smoke else SHAPES[args.shape]
    model = load_model(str(make_checkpoint(args.work / f"{'tiny' if args.smoke else args.shape}", shape, dtype)),
                       dtype, device)
    if not args.smoke:
        fused.use_fused_kernels(model)
    heads, dim = shape["num_key_value_heads"], shape["head_dim"]
    blocks = max(args.rows) * blocks_per_row(args.context)
    caches = [torch.zeros(2, blocks, BLOCK, heads, dim, dtype=dtype, device=device)
              for _ in range(shape["num_hidden_layers"])]
    result: dict[str, object] = {"shape": args.shape, "context": args.context, "gemv_ms": {}, "cublas_ms": {}}
    for rows in args.rows:
        result["gemv_ms"][rows] = step_ms(model, rows, args.context, caches, device, not args.smoke)
        limit = fused.MAX_TOKENS
        fused.MAX_TOKENS = 0 if rows > 1 else limit  # several rows through cuBLAS (one row keeps its GEMVs)
        try:
            result["cublas_ms"][rows] = step_ms(model, rows, args.context, caches, device, not args.smoke)
        finally:
            fused.MAX_TOKENS = limit
        one = result["gemv_ms"][1] if 1 in result["gemv_ms"] else None
        print(f"{rows} rows: GEMVs {result['gemv_ms'][rows]:.4f} ms, cuBLAS {result['cublas_ms'][rows]:.4f} ms"
              + (f", GEMVs / one row {result['gemv_ms'][rows] / one:.2f}x" if one else ""), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "few_token_step.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
