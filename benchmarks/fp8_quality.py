"""What --quantization fp8 costs in quality: perplexity of a model with its projections' weights in E4M3 (per output
channel, as runtime/native/models/fp8_checkpoint.py's quantize_model stores them) against the same model in bf16, in one run.

    python -m benchmarks.fp8_quality                 # the default model (SmolLM2-135M-Instruct), on the CPU
    python -m benchmarks.fp8_quality --device cuda   # on a GPU with FP8 tensor cores: the five settings

Settings: "bf16" (the checkpoint's weights), "fp8 weights" (every projection but the output head replaced by its E4M3
round trip: what the one-token GEMV multiplies, and what the CPU and pre-Ada GPUs serve), "fp8 weights + activations"
(also each projection's input rounded to E4M3 per token: what the tensor-core product of multi-row steps multiplies).
With `--device cuda` on a GPU with FP8 tensor cores, two more: "fp8 tensor cores" (every projection but the head
through the engine's own FP8 product, runtime/native/models/fp8.py's fp8_linear, float32 sums promoted periodically) and
"fp8 tensor cores, fast accumulation" (its FAST_ACCUM: the partial sums stay in the tensor cores).
Text and windows as benchmarks/cpu_quantization.py's quality figure (docs/scaling.md, windows of 512 tokens).
"""

from __future__ import annotations

import argparse
import sys

import torch

from benchmarks.cpu_quantization import TEXT, perplexities
import runtime.native.models.fp8 as fp8
from runtime.native.models.fp8 import dequantize, fp8_linear, native_fp8, quantize_activations, quantize_rows

SETTINGS = ("bf16", "fp8 weights", "fp8 weights + activations")
TENSOR_CORE_SETTINGS = ("fp8 tensor cores", "fp8 tensor cores, fast accumulation")


def _round_inputs(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    x = args[0]
    q, scale = quantize_activations(x.reshape(-1, x.shape[-1]), None)
    return ((q.float() * scale).to(x.dtype).reshape(x.shape),)


def _tensor_cores(module: torch.nn.Linear) -> None:
    """The projection's product through the engine's FP8 path (E4M3 weight rows, per-token activations)."""
    weight, scale = quantize_rows(module.weight)
    bias = module.bias

    def forward(x: torch.Tensor) -> torch.Tensor:
        y = fp8_linear(x.reshape(-1, x.shape[-1]).contiguous(), weight, scale, None, bias)
        return y.reshape(*x.shape[:-1], y.shape[-1])

    module.forward = forward  # type: ignore[method-assign]


def _e4m3(setting: str, name: str, module: torch.nn.Linear) -> None:
    """Every projection but the output head to its E4M3 round trip (and its inputs, in the third setting), or through
    the FP8 tensor-core product (the last two)."""
    if setting in TENSOR_CORE_SETTINGS:
        fp8.FAST_ACCUM = setting.endswith("fast accumulation")  # (the settings run one after another)
        if name != "lm_head":
            _tensor_cores(module)
    elif name != "lm_head" and setting != "bf16":
        module.weight.copy_(dequantize(*quantize_rows(module.weight), module.weight.dtype))
        if setting.endswith("activations"):
            module.register_forward_pre_hook(_round_inputs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="checkpoint folder (default: the default model)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--window", type=int, default=512, help="perplexity window, tokens")
    p.add_argument("--text-tokens", type=int, default=4096, help="most tokens of the held-out text scored")
    p.add_argument("--device", default="cpu", help="cuda: also the tensor-core settings (FP8 tensor cores needed)")
    args = p.parse_args(argv)
    from runtime.default_model import resolve_model

    model = resolve_model(args.model, args.dtype)[0]
    settings = SETTINGS + (TENSOR_CORE_SETTINGS if native_fp8(args.device) else ())
    tokens, result = perplexities(model, getattr(torch, args.dtype), args.window, args.text_tokens, settings, _e4m3,
                                  args.device)
    base = result["bf16"]
    print(f"{model}: {tokens} tokens of {TEXT.name}, windows of {args.window}, {args.dtype}")
    for setting, value in result.items():
        print(f"| {setting} | {value:.3f} | {value / base - 1:+.2%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
