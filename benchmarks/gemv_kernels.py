"""The one-token projections of runtime/native/cuda/gemv.py vs cuBLAS, for Llama-3.2-1B's weight shapes, over tile settings.

    python -m benchmarks.gemv_kernels                 # on a GPU: one JSON line per (shape, setting), then the best
    python -m benchmarks.gemv_kernels --smoke         # tiny shapes in Triton's interpreter without CUDA

Each figure is microseconds per call from a CUDA graph that runs the projection once per layer over `--layers`
different weights (as a decode step does; together larger than the L2 cache, so each call reads its weight from
memory), and the GB/s that makes. Baselines from the same run: `F.linear` (cuBLAS) on the same weights, with the
separate kernels a layer runs beside it (the RMSNorm, SwiGLU, residual add that the GEMV fuses) timed on their
own, and the bandwidth floor: the weight's bytes at `--peak-gbs`. With PDL each call is a programmatic dependent
launch of the one before; a chain of dependent calls checks that it gives the same bits as plain launches.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os

import torch

from benchmarks.cuda_decode_attention import per_call_us

# name: (N, K, fused prologue/epilogue); Llama-3.2-1B: hidden 2048, 32 + 2 x 8 heads of 64, MLP 8192, vocab 128256
SHAPES = {"qkv": (3072, 2048, "norm"), "o": (2048, 2048, "residual"), "gate_up": (16384, 2048, "norm+glu"),
          "down": (2048, 8192, "residual"), "lm_head": (128256, 2048, ""),
          # issue 43's shapes (--shapes l8b_qkv,...): Llama-3.1-8B (and Qwen3-8B's q/k/v and o, the same), Qwen3-8B's
          # MLP and head, Qwen3-30B-A3B's attention, router and head (its experts run runtime/native/cuda/one_token_moe.py's
          # own kernels: benchmarks/gpu_moe_profile.py)
          "l8b_qkv": (6144, 4096, "norm"), "l8b_o": (4096, 4096, "residual"), "l8b_gate_up": (28672, 4096, "norm+glu"),
          "l8b_down": (4096, 14336, "residual"), "l8b_lm_head": (128256, 4096, ""),
          "q8b_gate_up": (24576, 4096, "norm+glu"), "q8b_down": (4096, 12288, "residual"),
          "q8b_lm_head": (151936, 4096, ""), "q30b_qkv": (5120, 2048, "norm"), "q30b_o": (2048, 4096, "residual"),
          "q30b_router": (128, 2048, "norm"), "q30b_lm_head": (151936, 2048, "")}
SMOKE_SHAPES = {"qkv": (48, 32, "norm"), "gate_up": (64, 32, "norm+glu"), "down": (32, 64, "residual")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="qkv,o,gate_up,down,lm_head", help=f"of {', '.join(SHAPES)}")
    parser.add_argument("--block-n", default="4,8,16,32")
    parser.add_argument("--block-k", default="256,512,1024")
    parser.add_argument("--num-warps", default="4,8")
    parser.add_argument("--tiles", choices=("sweep", "table"), default="sweep",
                        help="sweep: every --block-n/--block-k/--num-warps setting; table: gemv.TILES' own")
    parser.add_argument("--pdl", default="false,true", help="launch kinds to time (true: only where supported)")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--peak-gbs", type=float, default=3350.0, help="memory bandwidth for the floor (H100 SXM)")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
    import torch.nn.functional as F

    from runtime.native.cuda import gemv as gemv_module
    from runtime.native.cuda import pdl
    from runtime.native.cuda.swiglu import silu_and_mul
    from runtime.native.cuda.norms import rms_norm

    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.bfloat16)
    shapes = SMOKE_SHAPES if args.smoke else {name: SHAPES[name] for name in args.shapes.split(",")}
    layers = 2 if args.smoke else args.layers
    g = torch.Generator().manual_seed(0)
    best: dict[str, dict] = {}
    for name, (n, k, fused) in shapes.items():
        weights = [torch.randn(n, k, generator=g).to(device, dtype) * k**-0.5 for _ in range(layers)]
        x = torch.randn(1, k, generator=g).to(device, dtype)
        norm_weight = torch.randn(k, generator=g).to(device, dtype)
        residual = torch.randn(1, n, generator=g).to(device, dtype)
        options = {"norm": (norm_weight, 1e-5) if "norm" in fused else None, "glu": "glu" in fused,
                   "residual": residual if "residual" in fused else None}

        def cublas(i: int) -> torch.Tensor:
            return F.linear(x, weights[i])

        def around(i: int) -> torch.Tensor:  # the unfused step's other kernels of this projection
            out = residual
            if options["norm"] is not None:
                out = rms_norm(x, norm_weight, 1e-5)
            if options["glu"]:
                out = silu_and_mul(residual)
            if options["residual"] is not None:
                out = residual + residual
            return out

        def unfused(i: int) -> torch.Tensor:
            v = x
            if options["norm"] is not None:
                v = rms_norm(x, norm_weight, 1e-5)
            out = F.linear(v, weights[i])
            if options["glu"]:
                out = silu_and_mul(out)
            return out + residual if options["residual"] is not None else out

        want = unfused(0)
        base = {"shape": name, "n": n, "k": k, "fused": fused, "mb": round(n * k * 2 / 1e6, 1),
                "floor_us": round(n * k * 2 / args.peak_gbs / 1e3, 2)}
        linear_us = per_call_us(cublas, layers)
        around_us = per_call_us(around, layers) if fused else 0.0
        print(json.dumps({**base, "setting": "cublas", "us": round(linear_us, 2), "around_us": round(around_us, 2),
                          "gbs": round(n * k * 2 / linear_us / 1e3) if cuda else None}), flush=True)
        pdl_options = [on for on in (False, True) if str(on).lower() in args.pdl.split(",") and (pdl.ENABLED or not on)]
        table = gemv_module.TILES.get((n, k), gemv_module.DEFAULT_TILE)
        settings = [table] if args.tiles == "table" else itertools.product(
            *(map(int, getattr(args, a).split(",")) for a in ("block_n", "block_k", "num_warps")))
        for block_n, block_k, warps in settings:
            gemv_module.TILES[(n, k)] = (block_n, block_k, warps)
            diff = (gemv_module.gemv(x, weights[0], **options).float() - want.float()).abs().max().item()
            for on in pdl_options:
                us = per_call_us(lambda i: gemv_module.gemv(x, weights[i], **options, pdl=on), layers)
                row = {**base, "setting": "gemv", "block_n": block_n, "block_k": block_k, "num_warps": warps,
                       "pdl": on, "us": round(us, 2), "gbs": round(n * k * 2 / us / 1e3) if cuda else None,
                       "max_diff": diff}
                print(json.dumps(row), flush=True)
                if name not in best or us < best[name]["us"]:
                    best[name] = row
        gemv_module.TILES[(n, k)] = table
    if pdl.ENABLED:
        print(json.dumps({"pdl_chain_equal": pdl_chain_equal(gemv_module.gemv, device, dtype)}), flush=True)
    print(json.dumps({"best": {name: {key: row[key] for key in ("block_n", "block_k", "num_warps", "pdl", "us", "gbs")}
                               for name, row in best.items()}}), flush=True)


def pdl_chain_equal(gemv, device: str, dtype: torch.dtype, steps: int = 64) -> bool:
    """A chain of dependent GEMVs (each reads the one before's output) captured in a graph gives the same bits with
    programmatic dependent launches as with plain ones: a launch that read its input early would differ."""
    g = torch.Generator().manual_seed(1)
    weights = [torch.randn(2048, 2048, generator=g).to(device, dtype) * 2048**-0.5 for _ in range(4)]
    x0 = torch.randn(1, 2048, generator=g).to(device, dtype)
    results = []
    for pdl in (False, True):
        out = {}

        def chain(_: int) -> None:
            x = x0
            for i in range(steps):
                x = gemv(x, weights[i % 4], norm=(weights[0][0], 1e-5), residual=x, pdl=pdl)
            out["x"] = x

        per_call_us(chain, 1)
        results.append(out["x"].clone())
    return bool(torch.equal(*results))


if __name__ == "__main__":
    main()
