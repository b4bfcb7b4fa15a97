"""What an INT4 weight-only checkpoint costs in quality: perplexity of a model whose projections hold the AWQ-style
calibration-free INT4 round trip (round to nearest, asymmetric, groups of --group input columns, float16 scales:
runtime/native/models/int4_checkpoint.py's quantize_rtn, dequantized by its reference) against the same model in bf16,
in one run. A real AWQ checkpoint (activation-aware scales) loses less than this round to nearest.

    python -m benchmarks.int4_quality                 # the default model (SmolLM2-135M-Instruct), on the CPU

Groups of 64 by default: SmolLM2-135M's width, 576, is not a multiple of AWQ's usual 128 (a projection whose input
width the group does not divide is left 16-bit and counted in the output).

Text and windows as benchmarks/cpu_quantization.py's quality figure (docs/scaling.md, windows of 512 tokens).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch

from benchmarks.cpu_quantization import TEXT, perplexities
from runtime.native.models.int4_checkpoint import dequantize, quantize_rtn


def _int4(group: int, skipped: set[str]) -> Callable[[str, str, torch.nn.Linear], None]:
    """perplexities' `replace`: INT4 in groups of `group`, the names of projections left 16-bit added to `skipped`."""
    def replace(setting: str, name: str, module: torch.nn.Linear) -> None:
        """Every projection but the output head to its INT4 round trip (the head stays 16-bit, as AWQ leaves it)."""
        in_features = module.weight.shape[1]
        if name == "lm_head" or setting == "bf16":
            return
        if in_features % group:
            skipped.add(name)
            return
        groups = torch.arange(in_features) // group
        q, zeros, scales = quantize_rtn(module.weight, groups, in_features // group, symmetric=False)
        module.weight.copy_(dequantize(q, zeros, scales, groups).to(module.weight.dtype))
    return replace


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="checkpoint folder (default: the default model)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--group", type=int, default=64, help="input columns per scale group")
    p.add_argument("--window", type=int, default=512, help="perplexity window, tokens")
    p.add_argument("--text-tokens", type=int, default=4096, help="most tokens of the held-out text scored")
    args = p.parse_args(argv)
    from runtime.default_model import resolve_model

    model = resolve_model(args.model, args.dtype)[0]
    settings = ("bf16", f"int4 g{args.group} RTN")
    skipped: set[str] = set()
    tokens, result = perplexities(model, getattr(torch, args.dtype), args.window, args.text_tokens, settings,
                                  _int4(args.group, skipped))
    base = result["bf16"]
    print(f"{model}: {tokens} tokens of {TEXT.name}, windows of {args.window}, {args.dtype}")
    print(f"projections left 16-bit (width not a multiple of {args.group}): {len(skipped)}")
    for setting, value in result.items():
        print(f"| {setting} | {value:.3f} | {value / base - 1:+.2%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
