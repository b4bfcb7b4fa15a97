"""Does destroy_process_group hang while a CUDA graph that captured an NCCL all-reduce is alive? Two ranks on two GPUs:
capture, replay, then destroy with the graph kept (`--keep`) or released and the device synchronized first. Prints one
line per rank with the seconds destroy took; the caller's timeout tells a hang.
    python -m benchmarks.nccl_graph_destroy [--keep] [--eager]"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank: int, keep: bool, eager: bool, port: int) -> None:
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0)
    dist.init_process_group("nccl", store=store, rank=rank, world_size=2, device_id=device)
    control = dist.new_group(backend="gloo")
    x = torch.ones(1024, device=device)
    dist.all_reduce(x)
    graph = None
    if not eager:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            dist.all_reduce(x)  # warm-up on the capture stream
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            dist.all_reduce(x)
        for _ in range(3):
            graph.replay()
    torch.cuda.synchronize()
    dist.barrier(group=control)
    if not keep:
        del graph
        torch.cuda.synchronize()
    started = time.perf_counter()
    dist.destroy_process_group()
    print(f"rank {rank}: destroy took {time.perf_counter() - started:.2f} s (keep={keep}, eager={eager})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keep", action="store_true", help="destroy while the graph is alive")
    parser.add_argument("--eager", action="store_true", help="no graph at all")
    args = parser.parse_args()
    port = 29000 + os.getpid() % 1000
    mp.spawn(rank_main, args=(args.keep, args.eager, port), nprocs=2, join=True)


if __name__ == "__main__":
    sys.exit(main())
