"""The batch-1 decode step of the Qwen3-30B-A3B shape taken apart on one GPU: random bf16 weights, one run.

    python -m benchmarks.gpu_moe_profile --out DIR            # on an H200: about 2 minutes
    python -m benchmarks.gpu_moe_profile --smoke --out DIR    # a tiny shape, Triton's interpreter on the CPU: seconds
    python -m benchmarks.gpu_moe_profile --smoke --device cuda --steps 5 --out DIR   # the tiny shape on the GPU

The model is benchmarks/gpu_families.py's (`random_model`: our model from the shape's config, N(0, 0.02) weights made
on the device) on the CUDA kernels. Phases, each written to DIR/gpu_moe_profile.json as it ends (a phase that raises
is recorded with its traceback, the others still run, and the run exits 1):
  bandwidth_tb_s  the copy bandwidth (benchmarks/gpu_bench.py) that sets the floors below
  b1              the decode step of one sequence at --context tokens, captured as the engine captures it
                  (runtime/native/cuda/graphs.py) and replayed back to back: device ms per step (CUDA events) against the
                  floor (gpu_families.floor_bytes over the bandwidth); `general_moe_ms`: the same step with each MoE
                  layer on the general path (the eager router, then runtime/native/cuda/moe.py's fused_experts), the path
                  every step took before runtime/native/cuda/one_token_moe.py
  kernels         torch.profiler over --profile-steps replays of that step: per kernel, device us and launches per
                  step, largest first; the step's kernel count. (From an eager step when the profiler saw no kernel
                  of the graph's replays.)
  moe_layer       one layer's MoE MLP for one token, the 48 layers' weights in turn from one graph (each reads
                  memory, as a step does): us per layer on one_token_moe and on the general path, against the bytes
                  the layer must read (router and the k chosen experts) over the bandwidth; `parts`: the layer
                  with one expert kernel's launches dropped, without PDL, and the dense GEMV on the same bytes;
                  one_token_moe's alternative tiles (gate/up, down, the router's); last, its kernels' split
  check           one_token_moe against the eager layer (router, `route`, `Experts.forward`, add) on random tokens
                  in bf16: the largest relative error, and the smallest gap between a chosen and an unchosen logit
                  (a near tie may route the two differently)
  moe_256         the experts of a 256-row decode step (runtime/native/cuda/moe.py's fused_experts after `route`, random
                  tokens), each layer's weights in turn from one graph: us per layer against the bytes of the
                  experts that got tokens over the bandwidth, on GEMM_TILES' tile and on GEMM_256_TILES
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.cuda_timing import HostEvent, ms_per_call

# (BLOCK_N, BLOCK_K, num_warps) alternatives to one_token_moe's tiles timed in moe_layer: the ones within ~1 us of
# the best in the H200 sweep of 2026-11-29 (benchmarks/RESULTS.md), and the router's former DEFAULT_TILE
GATE_UP_TILES = ((2, 1024, 4), (4, 512, 4), (16, 256, 4))
DOWN_TILES = ((4, 1024, 4), (8, 256, 4), (32, 256, 8))
ROUTER_TILES = ((2, 2048, 4), (4, 1024, 4))
# grouped-GEMM tiles (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) timed in moe_256: the tiles every step had
# before GEMM_TILES, then alternatives to GEMM_TILES' choice for 256 tokens
GEMM_256_TILES = ((16, 64, 64, 4, 3), (16, 128, 128, 4, 2), (32, 128, 128, 4, 3), (64, 128, 64, 4, 3))


def timed(fn: Callable[[int], Any], calls: int, cuda: bool, repeats: int = 5) -> float:
    """Microseconds per call of fn(i), i < calls: on CUDA from one graph of the calls (median of `repeats` replays),
    else one plain run of them on the host clock (the interpreter compiles nothing: no warm-up run)."""
    if not cuda:
        start = time.perf_counter()
        for i in range(calls):
            fn(i)
        return (time.perf_counter() - start) * 1e6 / calls
    for i in range(calls):
        fn(i)  # compiles, and allocates outside the graph
    graph = capture(lambda: [fn(i) for i in range(calls)])
    return replay_us(graph, repeats) / calls


def capture(fn: Callable[[], Any]) -> torch.cuda.CUDAGraph:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    return graph


def replay_us(graph: torch.cuda.CUDAGraph, repeats: int) -> float:
    """Median device microseconds of one replay, of `repeats` back to back."""
    return ms_per_call(graph.replay, rounds=repeats) * 1e3


def kernel_table(run: Callable[[], Any], steps: int, cuda: bool, top: int = 40) -> dict[str, Any]:
    """Per kernel (on the CPU: per operator) of `steps` runs of `run`: us and launches per step, largest first."""
    from torch.profiler import ProfilerActivity, profile

    activity = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        for _ in range(steps):
            run()
        if cuda:
            torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        us = (getattr(event, "self_device_time_total", 0) or getattr(event, "self_cuda_time_total", 0)) if cuda \
            else event.self_cpu_time_total
        if us > 0:
            rows.append({"name": event.key[:160], "us_per_step": round(us / steps, 2),
                         "per_step": round(event.count / steps, 2)})
    rows.sort(key=lambda r: -r["us_per_step"])
    return {"us_per_step": round(sum(r["us_per_step"] for r in rows), 1),
            "launches_per_step": round(sum(r["per_step"] for r in rows), 1), "top": rows[:top]}


def general_moe(moe: Any, x: torch.Tensor, norm: Any) -> torch.Tensor:
    """The MoE layer's MLP for one token on the general path: the RMSNorm kernel, the eager router and `route`, the
    fused experts (runtime/native/cuda/moe.py, patched onto the module), the residual add."""
    from runtime.native.cuda.norms import rms_norm

    return x + moe(rms_norm(x, norm.weight, norm.eps))


class DecodeStep:
    """One sequence's decode step at `context` tokens: its KV cache and inputs, graphed on CUDA as the engine does
    (runtime/native/cuda/graphs.py's DecodeGraphs, one row), op by op elsewhere."""

    def __init__(self, model: Any, context: int, cuda: bool, block_size: int = 16) -> None:
        from runtime.native.attention_metadata import AttentionMetadata
        from runtime.native.models import allocate_kv_cache

        self.model, self.cuda = model, cuda
        device = next(model.parameters()).device
        blocks = -(-context // block_size)
        self.kv = allocate_kv_cache(model.spec, blocks, block_size, torch.bfloat16, device)
        slot = context - 1  # blocks in order: the new token's K/V go to the last position
        if cuda:
            from runtime.native.cuda.graphs import DecodeGraphs
            from runtime.native.decode_rows import IDS, LENGTHS, PADDING, POSITIONS, SLOTS

            self.graphs = DecodeGraphs(model, self.kv, block_size, max_rows=1, max_blocks_per_seq=blocks)
            packed, tables = self.graphs.host_views(0)
            packed[:, 0] = PADDING  # no adapter, no pending token
            packed[IDS, 0], packed[POSITIONS, 0], packed[SLOTS, 0], packed[LENGTHS, 0] = 1, slot, slot, context
            tables[0, :] = range(blocks)
            self.graph = self.graphs.base[0][1]
            self.graph.replay()  # the graph's buffers now hold the step's inputs, which `eager` reads
            self.inputs = (self.graphs.ids[:1], self.graphs.packed[POSITIONS, :1], self.graphs.meta(1))
            return

        def tensor(values: list, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        self.inputs = (tensor([1]), tensor([slot]), AttentionMetadata(
            tensor([0, 1], torch.int32), tensor([slot], torch.int32), tensor([context], torch.int32),
            tensor([list(range(blocks))], torch.int32), tensor([slot]), block_size, 1, context, [1], [context]))

    def __call__(self) -> None:
        """The step: its graph replayed on CUDA, else op by op."""
        if self.cuda:
            self.graph.replay()
        else:
            self.eager()

    def eager(self) -> None:
        with torch.inference_mode():
            ids, positions, meta = self.inputs
            self.model.compute_logits(self.model(ids, positions, self.kv, meta))

    def ms(self, steps: int) -> float:
        """Device ms per step over `steps` back to back, after one step that compiles (host ms op by op on the CPU,
        where the interpreter compiles nothing: no warm-up step)."""
        if not self.cuda:
            return ms_per_call(self, steps, event=HostEvent)
        self()
        torch.cuda.synchronize()
        return ms_per_call(self, steps)


def moe_layer_figures(model: Any, bandwidth: float, cuda: bool, tiles: int) -> dict[str, Any]:
    """The moe_layer phase (module docstring), with the first `tiles` alternatives of each list."""
    from runtime.native.cuda import gemv as gemv_module
    from runtime.native.cuda import one_token_moe as otm
    from runtime.native.models.moe import MoE

    layers = [layer for layer in model.model.layers if isinstance(layer.mlp, MoE)]
    spec, hidden = layers[0].mlp.moe, model.spec.hidden_size
    x = torch.randn(1, hidden, generator=torch.Generator().manual_seed(0)).to(model.model.norm.weight)
    element = x.element_size()
    expert_bytes = 3 * spec.intermediate_size * hidden * element
    layer_bytes = spec.num_experts * hidden * element + spec.top_k * expert_bytes
    res: dict[str, Any] = {"bytes": layer_bytes, "floor_us": layer_bytes / (bandwidth * 1e6)}

    def fused(i: int) -> torch.Tensor:
        return otm.one_token_moe(layers[i].mlp, x, layers[i].post_attention_layernorm)

    with torch.inference_mode():
        res["one_token_us"] = timed(fused, len(layers), cuda)
        res["general_us"] = timed(lambda i: general_moe(layers[i].mlp, x, layers[i].post_attention_layernorm),
                                  len(layers), cuda)
        res["vs_floor"] = res["one_token_us"] / res["floor_us"]
        res["parts"] = moe_parts(layers, x, bandwidth, cuda, fused)
        for name, options in (("GATE_UP_TILE", GATE_UP_TILES), ("DOWN_TILE", DOWN_TILES)):
            kept = getattr(otm, name)
            for tile in options[:tiles]:
                setattr(otm, name, tile)
                res[f"{name.lower()}_{'x'.join(map(str, tile))}_us"] = timed(fused, len(layers), cuda)
            setattr(otm, name, kept)
        shape = (spec.num_experts, hidden)  # the router's tile (gemv.py's TILES), timed in the whole layer
        kept_router = gemv_module.TILES.get(shape)
        for tile in ((kept_router or gemv_module.DEFAULT_TILE), *ROUTER_TILES[:tiles]):
            gemv_module.TILES[shape] = tile
            res[f"router_{'x'.join(map(str, tile))}_us"] = timed(fused, len(layers), cuda)
        if kept_router is None:
            del gemv_module.TILES[shape]
        else:
            gemv_module.TILES[shape] = kept_router
        if cuda:  # last: the long table after the figures in the printed line
            graph = capture(lambda: [fused(i) for i in range(len(layers))])
            res["kernels_per_layer"] = kernel_table(graph.replay, 1, cuda)
    return res


class _Skipped:
    """Stands for a Triton kernel in `moe_parts`: its launches do nothing."""

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *args, **kwargs: None


def moe_parts(layers: list, x: torch.Tensor, bandwidth: float, cuda: bool,
              fused: Callable[[int], torch.Tensor]) -> dict[str, Any]:
    """Where one_token_moe's time goes: us per layer with the down kernel's launches dropped (router, routing,
    gate/up), with the gate/up kernel's dropped (router, routing, down), without PDL; and our dense GEMV
    (runtime/native/cuda/gemv.py) reading the same bytes as the gate/up and the down kernel (the k experts' rows as
    one matrix), each against its floor."""
    from runtime.native.cuda import gemv as gemv_module
    from runtime.native.cuda import one_token_moe as otm
    from runtime.native.cuda import pdl

    spec, hidden = layers[0].mlp.moe, x.shape[1]
    res: dict[str, Any] = {}
    for name in ("_down_kernel", "_gate_up_kernel"):
        kept = getattr(otm, name)
        setattr(otm, name, _Skipped())
        try:
            res[f"without{name}_us"] = timed(fused, len(layers), cuda)
        finally:
            setattr(otm, name, kept)
    kept_pdl = pdl.ENABLED
    pdl.ENABLED = False
    try:
        res["no_pdl_us"] = timed(fused, len(layers), cuda)
    finally:
        pdl.ENABLED = kept_pdl
    g = torch.Generator(device=x.device).manual_seed(3)
    inter, k = spec.intermediate_size, spec.top_k
    copies = min(len(layers), 8)  # distinct weights, more bytes than the L2 holds
    for name, n, width in (("gate_up", 2 * k * inter, hidden), ("down", hidden, k * inter)):
        weights = [torch.randn(n, width, generator=g, device=x.device).to(x.dtype) * 0.02 for _ in range(copies)]
        vector = torch.randn(1, width, generator=g, device=x.device).to(x.dtype)
        norm = (torch.ones(width, device=x.device, dtype=x.dtype), 1e-6)
        us = timed(lambda i: gemv_module.gemv(vector, weights[i % copies], norm=norm, pdl=pdl.ENABLED), copies, cuda)
        res[f"dense_{name}_us"] = us
        res[f"dense_{name}_floor_us"] = n * width * x.element_size() / (bandwidth * 1e6)
    return res


def moe_256_figures(model: Any, bandwidth: float, cuda: bool, rows: int, tiles: int) -> dict[str, Any]:
    """The moe_256 phase (module docstring), on `rows` tokens and the first `tiles` of GEMM_256_TILES."""
    from runtime.native.cuda import moe as cuda_moe
    from runtime.native.models.moe import MoE, route

    layers = [layer.mlp for layer in model.model.layers if isinstance(layer.mlp, MoE)]
    spec, hidden = layers[0].moe, model.spec.hidden_size
    g = torch.Generator().manual_seed(2)
    x = torch.randn(rows, hidden, generator=g).to(model.model.norm.weight)
    with torch.inference_mode():
        routed = [route(layer.gate(x), spec) for layer in layers]
        used = sum(int(torch.bincount(ids.view(-1), minlength=spec.num_experts).gt(0).sum()) for _, ids in routed)
        expert_bytes = 3 * spec.intermediate_size * hidden * x.element_size()
        res: dict[str, Any] = {"rows": rows, "experts_used_per_layer": used / len(layers),
                               "floor_us": used / len(layers) * expert_bytes / (bandwidth * 1e6)}

        def experts(i: int) -> torch.Tensor:
            return layers[i].experts(x, *routed[i])

        res["table_tile"] = "x".join(map(str, cuda_moe.gemm_tile(rows, x.dtype)))
        res["table_us"] = timed(experts, len(layers), cuda)
        kept = cuda_moe.gemm_tile
        try:
            for tile in GEMM_256_TILES[:tiles]:
                cuda_moe.gemm_tile = lambda tokens, dtype, memory, tile=tile: cuda_moe.fit_tile(tile, dtype, memory)
                res[f"tile_{'x'.join(map(str, tile))}_us"] = timed(experts, len(layers), cuda)
        finally:
            cuda_moe.gemm_tile = kept
    return res


def check(model: Any, tokens: int) -> dict[str, float]:
    """The check phase (module docstring)."""
    import torch.nn.functional as F

    from runtime.native.cuda.one_token_moe import one_token_moe
    from runtime.native.models.moe import MoE, Experts, route
    from runtime.native.models.norm import RMSNorm

    worst, gap = 0.0, float("inf")
    g = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for layer in model.model.layers:
            if not isinstance(layer.mlp, MoE):
                continue
            moe, norm = layer.mlp, layer.post_attention_layernorm
            for _ in range(tokens):
                x = torch.randn(1, model.spec.hidden_size, generator=g).to(norm.weight)
                normed = RMSNorm.forward(norm, x)  # the module's own forward, not the fused kernel patched on it
                logits = F.linear(normed, moe.gate.weight, moe.gate.bias)
                weights, ids = route(logits, moe.moe)
                want = (x + Experts.forward(moe.experts, normed, weights, ids)).float()
                got = one_token_moe(moe, x, norm).float()
                worst = max(worst, ((got - want).norm() / want.norm()).item())
                ranked = logits.float().sort(descending=True).values[0]
                gap = min(gap, (ranked[moe.moe.top_k - 1] - ranked[moe.moe.top_k]).item())
    return {"max_rel_err": worst, "min_logit_gap": gap}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--context", type=int, default=160, help="tokens in the cache at the decode step")
    parser.add_argument("--steps", type=int, default=200, help="replays timed")
    parser.add_argument("--profile-steps", type=int, default=5)
    parser.add_argument("--check-tokens", type=int, default=2, help="random tokens per MoE layer in `check`")
    parser.add_argument("--smoke", action="store_true", help="the tiny shape on the CPU: the code runs, nothing more")
    parser.add_argument("--device", default=None, help="cuda where there is one, cpu with --smoke (--smoke --device "
                        "cuda: the tiny shape on the GPU's kernels, benchmarks/gpu_smoke.sh)")
    args = parser.parse_args(argv)
    cuda = (args.device or ("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")) == "cuda"
    if not cuda:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
    from benchmarks.gpu_bench import bandwidth_tb_s
    from benchmarks.gpu_families import SHAPES, SMOKE_SHAPES, Phases, floor_bytes, random_model, write_config
    from runtime.native.cuda import enable_cuda_kernels
    from runtime.native.cuda import fused as fused_module

    device = "cuda" if cuda else "cpu"
    phases = Phases(args.out / "gpu_moe_profile.json", {"device": torch.cuda.get_device_name() if cuda else "cpu",
                                                         "date": time.strftime("%Y-%m-%d"), "context": args.context},
                    printed=2000)
    record = phases.record
    bandwidth = record("bandwidth_tb_s", lambda: bandwidth_tb_s(1 / 64 if args.smoke or not cuda else 1.0, device))
    model_type, shape = (SMOKE_SHAPES if args.smoke or not cuda else SHAPES)["qwen3-30b-a3b"]
    if not cuda:  # Triton's interpreter takes seconds a layer, and every layer runs the same code; its time goes
        # with the programs launched: fewer output rows (hidden, expert and vocabulary sizes) launch fewer
        shape = {**shape, "num_hidden_layers": 1, "hidden_size": 32, "moe_intermediate_size": 8, "vocab_size": 264}
    folder = write_config(args.out / "qwen3-30b-a3b", model_type, shape)
    model = random_model(str(folder), torch.bfloat16, device)
    enable_cuda_kernels(model)
    steps, profile_steps = (args.steps, args.profile_steps) if cuda else (1, 1)

    made: dict[str, DecodeStep] = {}

    def b1() -> dict[str, Any]:
        made["step"] = step = DecodeStep(model, args.context, cuda)
        res = {"step_ms": step.ms(steps), "floor_ms": floor_bytes(model, args.context) / (bandwidth * 1e9)}
        res["vs_floor"] = res["step_ms"] / res["floor_ms"]
        one_token_moe = fused_module.one_token_moe
        fused_module.one_token_moe = general_moe  # the graph below captures the general path
        try:
            res["general_moe_ms"] = DecodeStep(model, args.context, cuda).ms(steps)
        finally:
            fused_module.one_token_moe = one_token_moe
        return res

    if isinstance(bandwidth, float):
        record("b1", b1)
    if "step" in made:
        step = made["step"]
        table = record("kernels", lambda: kernel_table(step, profile_steps, cuda))
        if cuda and not table.get("launches_per_step"):  # the profiler saw no kernel of the replays
            record("kernels", lambda: {"eager_step": True, **kernel_table(step.eager, profile_steps, cuda)})
    if isinstance(bandwidth, float):
        record("moe_layer", lambda: moe_layer_figures(model, bandwidth, cuda, len(GATE_UP_TILES) if cuda else 1))
    record("check", lambda: check(model, args.check_tokens if cuda else 1))
    if isinstance(bandwidth, float):
        record("moe_256", lambda: moe_256_figures(model, bandwidth, cuda, 256 if cuda else 24,
                                                  len(GEMM_256_TILES) if cuda else 1))
    return 1 if phases.failed else 0


if __name__ == "__main__":
    sys.exit(main())
