"""The CUDA LoRA kernels (runtime/cuda/lora_kernels.py) against a float64 reference, and the hook in a CUDA graph.

On a CUDA machine they run on the GPU. Without CUDA they run in Triton's interpreter on the CPU, in a
child pytest process (TRITON_INTERPRET must be set before Triton is first imported), as in
test_cuda_kernels.py. Skipped when Triton is absent.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")
RUN_HERE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
kernels = pytest.mark.skipif(not RUN_HERE, reason="runs in the interpreter child process")
on_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")

from runtime.lora.apply import LoraBatch, LoraDelta  # noqa: E402
from runtime.lora.slots import LinearSlots  # noqa: E402
from runtime.lora.weights import LoraPair  # noqa: E402

if RUN_HERE:
    import runtime.cuda.lora_kernels as lora_kernels
    from runtime.cuda.lora_kernels import lora_shrink_expand


def test_kernels_in_triton_interpreter() -> None:
    if RUN_HERE:
        pytest.skip("the kernels run directly in this process")
    child = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", __file__],
                           env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=240)
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-2000:]
    assert "5 passed" in child.stdout, child.stdout[-2000:]


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
IN, OUT, SLOTS, CAP = 1000, 300, 4, 12  # cap not a power of two, in / out not multiples of the blocks
TOKEN_SLOTS = [0, -1, 1, 2, 2, -1, 0, 1, 0]  # slot 3 is empty (poisoned below), -1: base model


def _pairs(seed: int, spec: list[tuple[int, int, int]], dtype: torch.dtype) -> list[LoraPair]:
    """LoRA pairs (row start, row count, rank) with values that keep h and the delta near 1."""
    g = torch.Generator().manual_seed(seed)
    return [LoraPair(start, size, (torch.randn(rank, IN, generator=g) * IN**-0.5).to(dtype),
                     (torch.randn(size, rank, generator=g) * 0.5).to(dtype)) for start, size, rank in spec]


def _stacks(dtype: torch.dtype, device: str = DEVICE) -> LinearSlots:
    """Slots of different used ranks (the rest of `cap` zero, as DeviceSlots leaves it), slot 3 NaN."""
    stacks = LinearSlots(IN, OUT, num_slots=SLOTS, capacity=CAP, device=torch.device(device), dtype=dtype)
    stacks.write(0, _pairs(0, [(0, OUT, CAP)], dtype))
    stacks.write(1, _pairs(1, [(0, 100, 5)], dtype))
    stacks.write(2, _pairs(2, [(0, OUT, 3), (250, 50, 2)], dtype))
    stacks.a[:, 3] = float("nan")  # no token uses slot 3: a kernel reading it would poison the output
    stacks.b[:, 3] = float("nan")
    return stacks


def _reference(x: torch.Tensor, y: torch.Tensor, stacks: LinearSlots, token_slots: list[int]) -> torch.Tensor:
    """y + B[s] round(A[s] x) per token in float64, rounded once to y's dtype (rows with s = -1: y)."""
    a, b = stacks.a.double().cpu(), stacks.b.double().cpu()
    want = y.double().cpu()
    for t, s in enumerate(token_slots):
        if s >= 0:
            r = stacks.ranks[s]
            h = (a[:r, s] @ x[t].double().cpu()).to(x.dtype).double()
            want[t] += b[:r, s].T @ h
    return want.to(y.dtype)


def _inputs(layout: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, IN] and y [T, OUT] in the given layout, and the tensor y's storage belongs to."""
    g = torch.Generator().manual_seed(5)
    tokens = len(TOKEN_SLOTS)
    if layout == "contiguous":
        x = torch.randn(tokens, IN, generator=g).to(DEVICE, dtype)
        y = storage = torch.randn(tokens, OUT, generator=g).to(DEVICE, dtype)
    elif layout == "column-slices":  # as q / k / v split out of a fused projection's output
        x = torch.randn(tokens, IN + 24, generator=g).to(DEVICE, dtype)[:, 16 : 16 + IN]
        storage = torch.randn(tokens, OUT + 40, generator=g).to(DEVICE, dtype)
        y = storage[:, 8 : 8 + OUT]
    else:  # "transposed": feature-major x, and y a slice with a non-unit feature stride
        x = torch.randn(IN, tokens, generator=g).to(DEVICE, dtype).T
        storage = torch.randn(OUT, tokens + 3, generator=g).to(DEVICE, dtype)
        y = storage[:, 1 : 1 + tokens].T
    x[[t for t, s in enumerate(TOKEN_SLOTS) if s < 0]] = float("nan")  # base rows: never read
    return x, y, storage


@kernels
@pytest.mark.parametrize(
    ("dtype", "layout", "tile"),
    [(torch.float32, "contiguous", None), (torch.bfloat16, "contiguous", 512),
     (torch.float32, "column-slices", 512), (torch.bfloat16, "transposed", None)],
    ids=["fp32", "bf16-many-splits", "fp32-strided-many-splits", "bf16-transposed"],
)
def test_shrink_expand_matches_float64_reference(monkeypatch, dtype: torch.dtype, layout: str,
                                                 tile: int | None) -> None:
    if tile is not None:  # small weight tiles: `in` split over many programs, the last one partial
        monkeypatch.setattr(lora_kernels, "TILE", tile)
    stacks = _stacks(dtype)
    stacks.a[5:, 1] = float("nan")  # past slot 1's rank (5): rows the kernels must not load
    stacks.b[5:, 1] = float("nan")
    x, y, storage = _inputs(layout, dtype)
    before = storage.clone()
    want = _reference(x, y, stacks, TOKEN_SLOTS)
    token_slots = torch.tensor(TOKEN_SLOTS, dtype=torch.long, device=DEVICE)
    got = lora_shrink_expand(x, y, stacks.a, stacks.b, token_slots, stacks.device_ranks)
    assert got is y  # in place
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: a rounding step of h or y apart at most
    torch.testing.assert_close(got.cpu(), want, rtol=tol, atol=tol)
    base = [t for t, s in enumerate(TOKEN_SLOTS) if s < 0]
    view_of = {"contiguous": lambda s: s, "column-slices": lambda s: s[:, 8 : 8 + OUT],
               "transposed": lambda s: s[:, 1 : 1 + len(TOKEN_SLOTS)].T}[layout]
    assert torch.equal(got[base], view_of(before)[base])  # base rows bit-identical
    expected = before.clone()
    view_of(expected).copy_(got)
    assert torch.equal(storage, expected)  # nothing outside y's view written


@kernels
def test_hook_on_the_kernels_equals_the_cpu_product() -> None:
    """LoraDelta fed by LoraBatch.set (a prefill-sized step: sequences of many tokens, one on the base
    model; `in` in one slice): the kernel path gives the CPU path's result."""
    counts, seq_slots = [60, 1, 40, 20, 9], [2, -1, 0, 3, 1]
    cpu_stacks = _stacks(torch.float32, "cpu")
    cpu_stacks.a[:, 3] = 0  # slot 3 is used here; the CPU product multiplies every slot's columns
    cpu_stacks.b[:, 3] = 0
    cpu_stacks.write(3, _pairs(3, [(0, OUT, 4)], torch.float32))
    stacks = LinearSlots(IN, OUT, num_slots=SLOTS, capacity=CAP, device=torch.device(DEVICE), dtype=torch.float32)
    stacks.a.copy_(cpu_stacks.a)
    stacks.b.copy_(cpu_stacks.b)
    stacks.device_ranks.copy_(cpu_stacks.device_ranks)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(sum(counts), IN, generator=g), torch.randn(sum(counts), OUT, generator=g)
    cpu_batch = LoraBatch(SLOTS, torch.device("cpu"), torch.float32)
    cpu_batch.set(counts, seq_slots)
    want = LoraDelta(cpu_batch, cpu_stacks)(x, y.clone())
    batch = LoraBatch(SLOTS, torch.device(DEVICE), torch.float32)
    batch.set(counts, seq_slots)
    delta = LoraDelta(batch, stacks)
    delta.kernels = lora_shrink_expand  # what a CUDA hook has; the interpreter runs it on CPU tensors
    got = delta(x.to(DEVICE), y.to(DEVICE))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[60].cpu(), y[60])  # the base-model sequence's token


def _eager_reference(stacks: LinearSlots, weight: torch.Tensor, x: torch.Tensor, slots: list[int]) -> torch.Tensor:
    return _reference(x, x @ weight.T, stacks, slots)


@on_gpu
def test_lora_delta_in_a_cuda_graph_follows_slot_and_weight_changes() -> None:
    """Captured once with a static slot tensor; replays see new slots and newly written adapters."""
    dtype = torch.bfloat16
    stacks = _stacks(dtype)
    stacks.a[:, 3] = 0  # slot 3 is used below
    stacks.b[:, 3] = 0
    batch = LoraBatch(SLOTS, torch.device(DEVICE), dtype)
    delta = LoraDelta(batch, stacks)
    weight = (torch.randn(OUT, IN) * IN**-0.5).to(DEVICE, dtype)
    x = torch.randn(len(TOKEN_SLOTS), IN).to(DEVICE, dtype)

    batch.set([1] * len(TOKEN_SLOTS), TOKEN_SLOTS)  # eager CUDA step first
    torch.testing.assert_close(delta(x, x @ weight.T).cpu(), _eager_reference(stacks, weight, x, TOKEN_SLOTS),
                               rtol=2e-2, atol=2e-2)

    static_slots = torch.full((len(TOKEN_SLOTS),), -1, dtype=torch.long, device=DEVICE)
    batch.bind(static_slots)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        delta(x, x @ weight.T)  # warm-up (compilation) outside the graph
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = delta(x, x @ weight.T)
    torch.cuda.current_stream().wait_stream(stream)
    batch.clear()

    for slots in (TOKEN_SLOTS, [3, 3, -1, 1, 0, 2, -1, -1, 3]):
        if slots[0] == 3:
            stacks.write(3, _pairs(9, [(0, OUT, 7)], dtype))  # a new adapter lands in a slot after capture
            stacks.write(1, _pairs(8, [(200, 100, CAP)], dtype))
        static_slots.copy_(torch.tensor(slots))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out.cpu(), _eager_reference(stacks, weight, x, slots), rtol=2e-2, atol=2e-2)
