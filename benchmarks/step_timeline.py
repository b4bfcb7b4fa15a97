"""Where a batch-1 decode step's time goes, kernel by kernel, at real shapes (issues 43, 44 and 48's batch-1 figures).

    python -m benchmarks.step_timeline --out DIR                                  # on a GPU: Llama-3.1-8B, bf16
    python -m benchmarks.step_timeline --shape qwen3-30b-a3b --out DIR
    python -m benchmarks.step_timeline --quantization fp8 --out DIR              # FP8 weights (--quantization fp8)
    python -m benchmarks.step_timeline --quantization int4 --out DIR             # INT4 (AWQ's form, random values)
    python -m benchmarks.step_timeline --smoke --out DIR                          # a tiny shape on the CPU, seconds
    python -m benchmarks.step_timeline --smoke --device cuda --out DIR            # the tiny shape on the GPU

The model is benchmarks/gpu_families.py's (`random_model`: random weights at the shape, made on the device; shapes:
gpu_families.SHAPES and "llama-3.2-1b") on the CUDA kernels, and the step gpu_moe_profile.DecodeStep's: one
sequence at --context tokens, captured as the engine captures it and replayed. torch.profiler records --steps
replays; each kernel is charged its end minus the previous kernel's end. With programmatic dependent launches a
kernel starts while the one before it drains, so kernel durations overlap and do not add up to the step; these
increments do (`sum_us` against `step_us`), and a kernel's increment is what the step would lose without it.

Increments are summed by the kernel's place in a layer: a layer is the period between two attention kernels (a name
with "decode" in it), its places counted from the kernel before attention (the q/k/v projection), so a dense Llama
layer reads 0 q/k/v, 1 attention, 2 o, 3 gate/up + SwiGLU, 4 down + residual. Kernels outside the layers (the
embedding, the final norm, the output head, the argmax) are listed by name. `floor_us`: the bytes the step must
read (gpu_families.floor_bytes) at the measured copy bandwidth. Writes DIR/step_timeline.json.
On the CPU (--smoke) the step runs op by op and the profiler's top-level operators stand in for kernels: the figures
mean nothing there, the code runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from benchmarks import gpu_models as gm
from benchmarks.gpu_families import SHAPES, SMOKE_SHAPES, floor_bytes, random_model, write_config

SHAPE_NAMES = [*SHAPES, "llama-3.2-1b"]


def kernel_spans(run: Any, steps: int, cuda: bool) -> list[tuple[str, float, float]]:
    """(name, start us, end us) of every kernel of `steps` calls of `run`, in order (on the CPU: top-level
    operators)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            run()
        if cuda:
            torch.cuda.synchronize()
    kind = DeviceType.CUDA if cuda else DeviceType.CPU
    events = [e for e in prof.events() if e.device_type == kind and (cuda or e.cpu_parent is None)]
    return sorted(((e.name, e.time_range.start, e.time_range.end) for e in events), key=lambda span: span[1])


def timeline(spans: list[tuple[str, float, float]], steps: int) -> dict[str, Any]:
    """Increments (module docstring) of the steps after the first, by place in a layer and by name outside them."""
    per_step = len(spans) // steps
    places: dict[int, list[tuple[str, float, float]]] = {}
    outside: dict[str, list[float]] = {}
    period = 0
    for s in range(1, steps):
        step = spans[s * per_step:(s + 1) * per_step]
        attention = [i for i, (name, _, _) in enumerate(step) if "decode" in name]
        period = attention[1] - attention[0] if len(attention) > 1 else 0
        first = attention[0] - 1 if attention else len(step)
        last = attention[-1] - 1 + period if period else first
        previous_end = spans[s * per_step - 1][2]
        for i, (name, start, end) in enumerate(step):
            increment, previous_end = end - previous_end, end
            if first <= i < last:
                places.setdefault((i - first) % period, []).append((name, increment, end - start))
            else:
                outside.setdefault(name, []).append(increment)
    layers = max(1, len(places.get(0, [])) // max(1, steps - 1))
    return {
        "kernels_per_step": per_step, "layers": layers if places else 0, "layer_period": period,
        "by_place": [{"place": place, "name": rows[0][0][:60],
                      "increment_us_per_layer": round(statistics.mean(r[1] for r in rows), 2),
                      "duration_us_per_layer": round(statistics.mean(r[2] for r in rows), 2)}
                     for place, rows in sorted(places.items())],
        "outside_layers": [{"name": name[:60], "increment_us_per_step": round(sum(values) / (steps - 1), 1)}
                           for name, values in outside.items()],
        "sum_us": round(sum(r[1] for rows in places.values() for r in rows) / (steps - 1)
                        + sum(sum(values) for values in outside.values()) / (steps - 1), 1),
    }


def main(argv: list[str] | None = None) -> int:
    from benchmarks.gpu_bench import bandwidth_tb_s
    from benchmarks.gpu_moe_profile import DecodeStep

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="llama-3.1-8b", choices=SHAPE_NAMES)
    parser.add_argument("--quantization", default="none", choices=["none", "fp8", "int4"])
    parser.add_argument("--context", type=int, default=160)
    parser.add_argument("--steps", type=int, default=20, help="profiled replays (the first is left out)")
    parser.add_argument("--smoke", action="store_true", help="the tiny shape (on the CPU unless --device cuda)")
    parser.add_argument("--device", default=None, help="cuda where there is one, cpu with --smoke")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    cuda = device == "cuda"
    if args.smoke:
        model_type, shape = SMOKE_SHAPES["llama-3.1-8b"]
    else:
        model_type, shape = ("llama", gm.LLAMA_1B) if args.shape == "llama-3.2-1b" else SHAPES[args.shape]
    folder = write_config(args.out / args.shape, model_type, shape)
    if args.quantization == "int4":
        from benchmarks.gpu_quant import random_int4_model

        model = random_int4_model(str(folder), torch.bfloat16, device)
    else:
        model = random_model(str(folder), torch.bfloat16, device, quantization=args.quantization)
    if cuda:
        from runtime.native.cuda import enable_cuda_kernels

        enable_cuda_kernels(model)
    step = DecodeStep(model, args.context, cuda)
    step_ms = step.ms(100 if cuda else 2)
    bandwidth = bandwidth_tb_s(1 / 64 if args.smoke else 1.0, device)
    floor_ms = floor_bytes(model, args.context) / (bandwidth * 1e12) * 1e3
    result = {"shape": args.shape, "quantization": args.quantization, "context": args.context,
              "device": torch.cuda.get_device_name() if cuda else "cpu", "step_us": round(step_ms * 1e3, 1),
              "floor_us": round(floor_ms * 1e3, 1), "vs_floor": round(step_ms / floor_ms, 3),
              **timeline(kernel_spans(step, args.steps, cuda), args.steps)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "step_timeline.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
