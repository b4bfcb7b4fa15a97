"""One stream decoding for a while through the engine core (the server's default), to profile its host side:

    python -m benchmarks.decode_b1 --seconds 10                   # Llama-3.2-1B shape, random weights, CUDA
    py-spy record --subprocesses -o b1.txt -f raw -- python -m benchmarks.decode_b1 --seconds 10
    python -m benchmarks.decode_b1 --smoke                        # a tiny model on the CPU, for the test suite

Requests of `--tokens` tokens (128-token prompts) run one after another until `--seconds` have passed; prints the
median inter-token gap as the caller sees it, as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import gpu_models as gm
from benchmarks.gpu_bench import _request, _stream
from runtime.config import EngineConfig
from runtime.process.client import EngineClient


async def run(args: argparse.Namespace, folder: Path) -> dict[str, float]:
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    engine = EngineClient(EngineConfig(model=str(folder), device=device, dtype="bfloat16", max_batch_size=8,
                                       max_kv_tokens=8 * 4096, max_model_len=4096, enable_prefix_caching=False))
    await engine.start()
    gaps: list[float] = []
    try:
        stop_at = time.perf_counter() + args.seconds
        i = 0
        while time.perf_counter() < stop_at or not gaps:
            prompt = gm.random_prompts(1, 128, vocab, seed=i)[0]
            _, arrivals, _ = await _stream(engine, _request(f"b1-{i}", prompt, args.tokens))
            gaps.extend(b - a for a, b in zip(arrivals[1:], arrivals[2:]))
            i += 1
    finally:
        await engine.shutdown()
    return {"itl_ms_p50": statistics.median(gaps) * 1e3, "tokens": len(gaps) + i}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--tokens", type=int, default=1024, help="tokens per request")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    shape = gm.TINY if args.smoke else gm.LLAMA_1B
    if args.smoke:
        args.seconds, args.tokens = min(args.seconds, 1.0), min(args.tokens, 16)
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work) / "model"
        gm.make_checkpoint(folder, shape, torch.bfloat16)
        print(json.dumps(asyncio.run(run(args, folder))), flush=True)


if __name__ == "__main__":
    main()
