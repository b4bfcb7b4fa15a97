"""HTTP against the engine core in interleaved rounds, on one machine at one time (issue 15's ratios):

    python -m benchmarks.http_vs_core --streams 64 --rounds 4                       # CUDA, Llama-3.2-1B shape
    python -m benchmarks.http_vs_core --streams 256 --api-servers 4 --consumers 4
    python -m benchmarks.http_vs_core --streams 64 --output-std 32                  # lengths that drift apart
    python -m benchmarks.http_vs_core --smoke                                       # tiny model on the CPU
    python -m benchmarks.http_vs_core --smoke --device cuda                         # tiny model on the GPU

Both sides stay up for the whole run: the gateway (`gateway serve`, its engine core in its own process, with
`--api-servers` front ends) and a second engine core of the same configuration driven through EngineClient from
`--consumers` processes (benchmarks/core_consumers.py: the load's shape without HTTP). Rounds of `--seconds`
alternate core, HTTP, HTTP, core, core, HTTP, ... (each pair in turn starts with the other side, so a drift of
the machine weighs on both), while the other side idles. Each pair gives a ratio, HTTP tok/s over core tok/s;
prints every round and the median ratio as JSON (and writes it to --out). Each HTTP round also tells how busy the front
ends were at their busiest (CPU seconds per wall second over 2 s), how busy the client processes were, and the
gateway's own mean time to first token (from its arrival at the engine; one front end only), beside the
client's and the engine core's. Both sides count their engine core's steps and how many of them ran op by op
(not replayed from CUDA graphs). Both sides also give, as p50 over requests, the time per output token after
the first, the time from sending a request to its last token, and the time from a stream's previous request
ending to the next one's send: a stream's cycle is the last two, so they tell where HTTP's tokens per second
go (a slower step, a later first token, or a longer turnover at the client).

Why: as separate phases of one gpu_bench call the two figures moved 10-20 points between calls of the same
code (the engine core's own figure 35-55k tok/s), more than the goals' margins.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from benchmarks import gpu_models as gm
from benchmarks.core_consumers import CoreConsumers
from benchmarks.gpu_bench import FULL, SMOKE, client_processes, engine_config, gateway_command, http_load, http_server


async def run(args: argparse.Namespace) -> dict[str, Any]:
    base = SMOKE if args.smoke else FULL
    s = dataclasses.replace(base, batch=args.streams, streams=args.streams, closed_loop_s=args.seconds,
                            http_s=args.seconds, output_std=args.output_std)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    folder = gm.make_checkpoint(Path(args.work) / ("smoke-llama1b" if args.smoke else "llama1b"), s.big,
                                torch.bfloat16)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    extra = ["--api-servers", str(args.api_servers)] if args.api_servers > 1 else []
    extra += ["--stream-interval", str(args.stream_interval)]
    label = (f"http-vs-core-{args.streams}-api{args.api_servers}"
             + (f"-clients{args.client_processes}" if args.client_processes else "")
             + (f"-interval{args.stream_interval}" if args.stream_interval > 1 else "")
             + (f"-std{args.output_std:g}" if args.output_std else ""))
    rounds: list[dict[str, Any]] = []
    with http_server(gateway_command(folder, args.device, s, args.streams, *extra), label, out, "/health") as server:
        config = dataclasses.replace(engine_config(folder, args.device, s), stream_interval=args.stream_interval)
        async with CoreConsumers(config, s, vocab, seed=7, processes=args.consumers) as core:
            await asyncio.to_thread(http_load, server, folder, dataclasses.replace(s, http_s=min(3.0, s.http_s)),
                                    args.streams)  # warm-up
            for i in range(args.rounds):
                pair: dict[str, Any] = {}
                for side in ("core", "http") if i % 2 == 0 else ("http", "core"):
                    t = time.perf_counter()
                    if side == "core":
                        result = await core.round()
                        pair["core_tok_s"] = result[f"closed_loop_{s.batch}_tok_s_client_procs"]
                        pair["core_ttft_ms_p50"] = statistics.median(result["client_procs_ttft_ms_p50"])
                        for name in ("tpot", "e2e", "gap"):
                            pair[f"core_{name}_ms_p50"] = statistics.median(result[f"client_procs_{name}_ms_p50"])
                        pair["core_steps"], pair["core_eager_steps"] = result["steps"], result["eager_steps"]
                    else:
                        before = _scrape(server.base_url)
                        load = asyncio.ensure_future(asyncio.to_thread(http_load, server, folder, s, args.streams,
                                                                       clients=args.client_processes))
                        busy = await _busiest(server, load, window=min(2.0, s.http_s / 2))
                        summary = await load
                        pair["http_tok_s"] = summary["output_token_throughput"]
                        pair["http_events_s"] = summary["events_per_s"]
                        pair["front_end_cpu_busy_peak"] = busy
                        pair["client_cpu_busy"] = round(summary["client_cpu_s"] / summary["duration_s"]
                                                        / (args.client_processes or client_processes(args.streams)), 2)
                        change = {k: v - before[k] for k, v in _scrape(server.base_url).items()}
                        if args.api_servers == 1:  # with several front ends a scrape reaches any one of them
                            pair["server_ttft_ms_mean"] = 1e3 * change["ttft_sum"] / max(change["ttft_count"], 1)
                        # the engine core's counters: the same from every front end
                        pair["http_steps"], pair["http_eager_steps"] = change["steps"], change["eager_steps"]
                        pair["http_ttft_ms_p50"] = summary["ttft_ms"].get("p50")
                        for name in ("tpot", "e2e", "gap"):
                            pair[f"http_{name}_ms_p50"] = summary[f"{name}_ms"].get("p50")
                    print(f"[round {i} {side}] {time.perf_counter() - t:.1f}s", file=sys.stderr, flush=True)
                pair["ratio"] = pair["http_tok_s"] / pair["core_tok_s"]
                rounds.append(pair)
    result = {"streams": args.streams, "api_servers": args.api_servers, "consumers": args.consumers,
              "stream_interval": args.stream_interval, "output_std": args.output_std,
              "seconds": args.seconds, "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
              "rounds": rounds, "ratio_median": statistics.median(r["ratio"] for r in rounds),
              "ratio_of_sums": sum(r["http_tok_s"] for r in rounds) / sum(r["core_tok_s"] for r in rounds)}
    (out / f"{label}.json").write_text(json.dumps(result, indent=1))
    return result


async def _busiest(server: Any, load: asyncio.Future[Any], window: float = 2.0) -> float:
    """The front ends' CPU seconds per wall second over their busiest `window` s while `load` runs (1.0: one
    core saturated): a figure of the steady part, free of the load generator's start-up and drain (shorter than a
    round: a smoke run's rounds last 0.3 s)."""
    samples = [(time.perf_counter(), server.front_end_cpu_seconds())]
    while not load.done():
        await asyncio.sleep(0.25)
        samples.append((time.perf_counter(), server.front_end_cpu_seconds()))
    rates = [(c1 - c0) / (t1 - t0) for (t0, c0) in samples for (t1, c1) in samples if window <= t1 - t0 < window + 0.3]
    return round(max(rates, default=0.0), 2)


def _scrape(base_url: str) -> dict[str, float]:
    """From the gateway's /metrics: the sum and count of its time-to-first-token histogram (arrival at the engine
    to its first token), and the engine core's steps and eager steps since start."""
    text = httpx.get(base_url + "/metrics", timeout=30).text
    value = lambda name: sum(float(line.split()[-1]) for line in text.splitlines()  # noqa: E731
                             if line.startswith(f"trtllm_gateway_{name} "))
    return {"ttft_sum": value("time_to_first_token_seconds_sum"),
            "ttft_count": value("time_to_first_token_seconds_count"),
            "steps": value("engine_iterations_total"), "eager_steps": value("engine_eager_iterations_total")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.http_vs_core", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--api-servers", type=int, default=1, help="the gateway's front-end processes")
    parser.add_argument("--consumers", type=int, default=1, help="processes driving the engine core directly")
    parser.add_argument("--client-processes", type=int, default=None,
                        help="load-generator processes for HTTP (default: gpu_bench.client_processes)")
    parser.add_argument("--stream-interval", type=int, default=1, help="both sides' engine --stream-interval")
    parser.add_argument("--output-std", type=float, default=0.0,
                        help="spread of tokens out per request, both sides (Normal around the mean; 0: all equal, "
                             "so the streams stay in step)")
    parser.add_argument("--rounds", type=int, default=4, help="pairs of one core and one HTTP round")
    parser.add_argument("--seconds", type=float, default=10.0, help="each round's length")
    parser.add_argument("--device", default=None, help="default cuda; with --smoke cpu (--smoke --device cuda: the "
                        "tiny model on the GPU, benchmarks/gpu_smoke.sh)")
    parser.add_argument("--out", default="/tmp/http_vs_core")
    parser.add_argument("--work", default="/tmp/gpu_bench_models", help="folder for the random checkpoint")
    parser.add_argument("--smoke", action="store_true", help="tiny model on the CPU, 0.3 s rounds: proves the code runs")
    args = parser.parse_args(argv)
    args.device = args.device or ("cpu" if args.smoke else "cuda")
    if args.smoke:
        args.seconds, args.streams = min(args.seconds, 0.3), min(args.streams, 8)
        args.rounds, args.consumers, args.api_servers = min(args.rounds, 2), min(args.consumers, 2), min(args.api_servers, 2)
    print(json.dumps(asyncio.run(run(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
