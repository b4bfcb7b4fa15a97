"""What one proposal of EAGLE's draft chain costs, apart from the target's steps (issue 46), and where it goes.

The shipped head (runtime/demo/smollm2_eagle) over a random target of the default model's shape (its embedding and
lm_head are all the chain reads of the target: 2 layers stand in for 30), in a slot of the default model's capacity
(8,192 positions and a chain). For each sequence length and number of drafts k: the host time of a whole
`EagleChain.propose` (inputs up, graph replay, drafts read), the device time of the replay alone, and the kernels of
one op-by-op proposal under torch's profiler. The chain's attention reads a span of the slot that grows with the
length (eagle_chain.py), so the lengths tell what that read costs.

    python -m benchmarks.eagle_chain_cost --device cuda --out /tmp/chain      # on the GPU
    python -m benchmarks.eagle_chain_cost --smoke --out /tmp/chain            # the same code in seconds, CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks.gpu_models import SMOLLM2_135M, make_checkpoint
from runtime.native.models import load_model
from runtime.native.speculative.eagle import load_head
from runtime.native.speculative.eagle_chain import EagleChain

HEAD = Path(__file__).resolve().parent.parent / "runtime" / "demo" / "smollm2_eagle"
TARGET = dict(SMOLLM2_135M, num_hidden_layers=2)  # the chain reads its embedding and lm_head only
SMOKE = dict(TARGET, vocab_size=2048)


def proposal_us(chain: EagleChain, length: int, k: int, calls: int) -> tuple[float, float]:
    """(host us of a whole proposal, device us of the graph's replay) after a sequence of `length` tokens."""
    last = length - 2
    tokens = [(7 * i) % 1000 for i in range(last + k + 2)]
    chain.warm_up(k)
    host = []
    for _ in range(calls):
        start = time.perf_counter()
        chain.propose(0, 0, last, tokens, k)
        host.append((time.perf_counter() - start) * 1e6)
    device = float("nan")
    graph = chain._graphs.get((k, next(s for s in chain.spans if s > last + k)))
    if graph is not None:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(calls):
            graph.replay()
        end.record()
        end.synchronize()
        device = begin.elapsed_time(end) * 1e3 / calls
    return statistics.median(host), device


def kernels(chain: EagleChain, k: int, span: int, top: int = 15) -> list[dict[str, float | str]]:
    """The device kernels of one op-by-op proposal over `span` positions (a graph's work), by total time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with torch.inference_mode(), profile(activities=activities) as prof:
        chain._forward((k, span))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    device = torch.cuda.is_available()
    events = [e for e in prof.key_averages() if (e.device_time_total if device else e.self_cpu_time_total) > 0]
    events.sort(key=lambda e: e.device_time_total if device else e.self_cpu_time_total, reverse=True)
    return [{"name": e.key[:80], "calls": e.count,
             "us": round(e.device_time_total if device else e.self_cpu_time_total, 1)} for e in events[:top]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--capacity", type=int, default=8256, help="the slot's positions (default model's)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[200, 900, 6000])
    parser.add_argument("--drafts", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--work", type=Path, default=Path("/tmp/eagle_chain_cost"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true",
                        help="a small vocabulary and few calls (on the CPU: timings mean nothing)")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), torch.bfloat16 if args.device == "cuda" else torch.float32
    shape = SMOKE if args.smoke else TARGET
    calls = 3 if args.smoke else args.calls
    target = load_model(str(make_checkpoint(args.work / f"target_{shape['vocab_size']}", shape, dtype)), dtype,
                        device)
    head = load_head(str(HEAD), dtype, device, shape["num_hidden_layers"])
    result: dict[str, object] = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                                 "proposals": {}, "kernels": {}}
    chain = EagleChain(head, target, 1, args.capacity, device, graphs=device.type == "cuda")  # type: ignore[arg-type]
    for length in args.lengths:
        for k in args.drafts:
            host, replay = proposal_us(chain, length, k, calls)
            result["proposals"][f"{length}x{k}"] = {"host_us": round(host, 1), "replay_us": round(replay, 1)}
            print(f"length {length:5d} k={k}: proposal {host:8.1f} us host, replay {replay:8.1f} us device", flush=True)
    for span in (chain.spans[0], chain.spans[-1]):
        result["kernels"][str(span)] = kernels(chain, max(args.drafts), span)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "eagle_chain_cost.json").write_text(json.dumps(result, indent=1))
    for span, rows in result["kernels"].items():
        print(f"kernels of one proposal over {span} positions, k={max(args.drafts)}:")
        for row in rows:
            print(f"  {row['us']:9.1f} us {row['calls']:4d}x {row['name']}")


if __name__ == "__main__":
    main()
