"""What --quantization fp8 costs in quality: perplexity of a model with its projections' weights in E4M3 (per output
channel, as runtime/native/models/fp8_checkpoint.py's quantize_model stores them) against the same model in bf16, in one run.

    python -m benchmarks.fp8_quality                 # the default model (SmolLM2-135M-Instruct), on the CPU

Settings: "bf16" (the checkpoint's weights), "fp8 weights" (every projection but the output head replaced by its E4M3
round trip: what the one-token GEMV multiplies, and what the CPU and pre-Ada GPUs serve), "fp8 weights + activations"
(also each projection's input rounded to E4M3 per token: what the tensor-core product of multi-row steps multiplies).
Text and windows as benchmarks/cpu_quantization.py's quality figure (docs/scaling.md, windows of 512 tokens).
"""

from __future__ import annotations

import argparse
import sys

import torch

from benchmarks.cpu_quantization import TEXT, perplexities
from runtime.native.models.fp8 import dequantize, quantize_activations, quantize_rows

SETTINGS = ("bf16", "fp8 weights", "fp8 weights + activations")


def _round_inputs(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    x = args[0]
    q, scale = quantize_activations(x.reshape(-1, x.shape[-1]), None)
    return ((q.float() * scale).to(x.dtype).reshape(x.shape),)


def _e4m3(setting: str, name: str, module: torch.nn.Linear) -> None:
    """Every projection but the output head to its E4M3 round trip (and its inputs, in the last setting)."""
    if name != "lm_head" and setting != "bf16":
        module.weight.copy_(dequantize(*quantize_rows(module.weight), module.weight.dtype))
        if setting.endswith("activations"):
            module.register_forward_pre_hook(_round_inputs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="checkpoint folder (default: the default model)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--window", type=int, default=512, help="perplexity window, tokens")
    p.add_argument("--text-tokens", type=int, default=4096, help="most tokens of the held-out text scored")
    args = p.parse_args(argv)
    from runtime.default_model import resolve_model

    model = resolve_model(args.model, args.dtype)[0]
    tokens, result = perplexities(model, getattr(torch, args.dtype), args.window, args.text_tokens, SETTINGS, _e4m3)
    base = result["bf16"]
    print(f"{model}: {tokens} tokens of {TEXT.name}, windows of {args.window}, {args.dtype}")
    for setting, value in result.items():
        print(f"| {setting} | {value:.3f} | {value / base - 1:+.2%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
