"""The front end's event loop beside an engine core stepping at GPU speed, without a GPU (issue 15's loop lag).

    python -m benchmarks.front_end_lag                       # 64 closed-loop streams, a 2.3 ms step, 15 s
    python -m benchmarks.front_end_lag --streams 4 --seconds 1 --step-ms 5      # the test suite's smoke run

The front end is the server's: an EngineClient (runtime/process/client.py), attached as a second front end to
a synthetic core in its own process that speaks the real messages (runtime/process/messages.py). The core
gives every running request one token per step, every `--step-ms` (2.3 ms: the H200's step at 64 streams of
Llama-3.2-1B), and ends it after `--output` tokens; a request joins at the next step. The load is gpu_bench's
closed loop (its `_closed_loop`: 128-token prompts, streams that start together and so finish together),
with the loop's lag measured as gpu_bench does: how late a 1 ms sleep wakes up. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time

import zmq

from benchmarks.gpu_bench import FULL, _closed_loop
from runtime.config import EngineConfig
from runtime.engine import EngineStats
from runtime.process.client import EngineClient, FrontEnd
from runtime.process.messages import (
    Abort, AddRequest, Attach, Ready, Shutdown, StepOutputs, encoder, to_core,
)
from runtime.request import OutputDelta, Usage


def synthetic_core(folder: str, step_s: float) -> None:
    """Serve front end 1 of `folder` as an engine core whose steps take `step_s` and produce token 7 each."""
    addresses = FrontEnd(1, 2).addresses(folder)
    context = zmq.Context.instance()
    receiver, sender = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    receiver.connect(addresses.to_core)
    sender.connect(addresses.to_front_end)
    # Ready answers the front end's Attach, as a real core answers a front end it did not start: sent unasked, it
    # could arrive before this core's inbox had connected, and the first request then failed with zmq.Again
    while not isinstance(to_core.decode(receiver.recv()), Attach):
        pass
    sender.send(encoder.encode(Ready({}, EngineStats(), os.getpid())))
    running: dict[str, list[int]] = {}  # request id -> [tokens given, max_tokens, prompt tokens]
    next_step = time.perf_counter()
    while True:
        while receiver.poll(0):
            msg = to_core.decode(receiver.recv())
            if isinstance(msg, AddRequest):
                running[msg.request.request_id] = [0, msg.max_tokens, len(msg.prompt_token_ids)]
            elif isinstance(msg, Abort):
                for request_id in msg.request_ids:
                    running.pop(request_id, None)
            elif isinstance(msg, Shutdown):
                return
        if running:
            deltas = []
            for request_id, state in list(running.items()):
                state[0] += 1
                final = state[0] >= state[1]
                delta = OutputDelta(request_id, token_ids=[7], finish_reason="length" if final else None,
                                    usage=Usage(state[2], state[0]) if final else None)
                deltas.append((request_id, [delta], final))
                if final:
                    del running[request_id]
            sender.send(encoder.encode(StepOutputs(deltas, None)))
        next_step += step_s
        time.sleep(max(0.0, next_step - time.perf_counter()))


async def measure(args: argparse.Namespace) -> dict[str, float]:
    folder = tempfile.mkdtemp(prefix="front-end-lag-")
    core = subprocess.Popen([sys.executable, "-m", "benchmarks.front_end_lag", "--core", folder,
                             "--step-ms", str(args.step_ms)])
    engine = EngineClient(EngineConfig(model="demo"), FrontEnd(1, 2, folder))
    try:
        await engine.start()
        sizes = dataclasses.replace(FULL, streams=args.streams, closed_loop_s=args.seconds, output=args.output)
        result = await _closed_loop(engine, sizes, engine.model_info.vocab_size, seed=0)
    finally:
        try:
            engine._send(Shutdown(0.0))
            core.wait(10)
        except (zmq.Again, subprocess.TimeoutExpired):  # a start that failed: the core must not outlive the run
            core.kill()
            core.wait()
        await engine.shutdown()
    return {"streams": args.streams, "step_ms": args.step_ms, **result}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--step-ms", type=float, default=2.3)
    parser.add_argument("--output", type=int, default=128, help="tokens per request")
    parser.add_argument("--core", help=argparse.SUPPRESS)  # the synthetic core's process: its socket folder
    args = parser.parse_args(argv)
    if args.core:
        synthetic_core(args.core, args.step_ms / 1000)
        return
    print(json.dumps(asyncio.run(measure(args))), flush=True)


if __name__ == "__main__":
    main()
