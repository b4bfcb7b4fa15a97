"""The CUDA LoRA path (A folded under the base weight, runtime/native/cuda/lora_kernels.py) against a float64
reference and the CPU product, and the hook in a CUDA graph.

On a CUDA machine they run on the GPU; without CUDA in Triton's interpreter (tests/triton_interpreter.py).
Skipped when Triton is absent.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
from tests.triton_interpreter import RUN_HERE, kernels, run_in_interpreter  # noqa: E402
on_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")

from runtime.native.lora.apply import LoraBatch, LoraDelta  # noqa: E402
from runtime.native.lora.slots import LinearSlots  # noqa: E402
from runtime.native.lora.weights import LoraPair  # noqa: E402
from runtime.native.models.linear import Linear  # noqa: E402

if RUN_HERE:
    import runtime.native.lora.apply as apply
    from runtime.native.cuda.lora_kernels import lora_expand


def test_kernels_in_triton_interpreter() -> None:
    run_in_interpreter(__file__, passed=6)


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
IN, OUT, SLOTS, CAP = 200, 300, 4, 12  # cap not a power of two, out not a multiple of the kernel's block
TOKEN_SLOTS = [0, -1, 1, 2, 2, -1, 0, 1, 0]  # slot 3 is empty (poisoned below), -1: base model


def _pairs(seed: int, spec: list[tuple[int, int, int]], dtype: torch.dtype) -> list[LoraPair]:
    """LoRA pairs (row start, row count, rank) with values that keep h and the update near 1."""
    g = torch.Generator().manual_seed(seed)
    return [LoraPair(start, size, (torch.randn(rank, IN, generator=g) * IN**-0.5).to(dtype),
                     (torch.randn(size, rank, generator=g) * 0.5).to(dtype)) for start, size, rank in spec]


def _folded(dtype: torch.dtype, device: str = DEVICE, bias: bool = False) -> tuple[Linear, LinearSlots]:
    """A Linear with its slots folded under its weight (the CUDA layout): slots of ranks 12, 5 and 3 + 2."""
    g = torch.Generator().manual_seed(7)
    linear = Linear(IN, [("p", OUT)], bias=bias, dtype=dtype).to(device)
    linear.weight.data.copy_(torch.randn(OUT, IN, generator=g) * IN**-0.5)
    if bias:
        linear.bias.data.copy_(torch.randn(OUT, generator=g))
    stacks = LinearSlots(IN, OUT, num_slots=SLOTS, capacity=CAP, device=torch.device(device), dtype=dtype, base=linear)
    assert linear.weight.data_ptr() == stacks.weight.data_ptr()  # the base weight moved into the stacked buffer
    stacks.write(0, _pairs(0, [(0, OUT, CAP)], dtype))
    stacks.write(1, _pairs(1, [(0, 100, 5)], dtype))
    stacks.write(2, _pairs(2, [(0, OUT, 3), (250, 50, 2)], dtype))
    return linear, stacks


def _reference(x: torch.Tensor, linear: Linear, stacks: LinearSlots, token_slots: list[int]) -> torch.Tensor:
    """round(x W^T + b) + B[s] round(A[s] x) per token in float64, rounded once (rows of s = -1: the base)."""
    base = torch.nn.functional.linear(x, linear.weight, linear.bias).double().cpu()
    a, b = stacks.a.double().cpu(), stacks.b.double().cpu()
    for t, s in enumerate(token_slots):
        if s >= 0:
            r = stacks.ranks[s]
            h = (a[:r, s] @ x[t].double().cpu()).to(x.dtype).double()
            base[t] += b[:r, s].T @ h
    return base.to(x.dtype)


@kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_matmul_and_the_expand_kernel_match_float64(dtype: torch.dtype) -> None:
    linear, stacks = _folded(dtype)
    assert stacks.matmul_rank == CAP  # the widest slot (12) rounded up to a power of two (16), capped at cap
    stacks.a[:, 3] = float("nan")  # no token uses slot 3: reading it would poison the output
    stacks.b[:, 3] = float("nan")
    stacks.a[5:, 1] = float("nan")  # past slot 1's rank (5): rows the kernel must not load
    stacks.b[5:, 1] = float("nan")
    x = torch.randn(len(TOKEN_SLOTS), IN, generator=torch.Generator().manual_seed(5)).to(DEVICE, dtype)
    width = OUT + stacks.matmul_rank * SLOTS
    y_ext = torch.nn.functional.linear(x, stacks.weight[:width])
    if dtype == torch.bfloat16:  # a transposed layout, as a matmul may return for some shapes
        y_ext = y_ext.T.contiguous().T
    token_slots = torch.tensor(TOKEN_SLOTS, dtype=torch.long, device=DEVICE)
    got = lora_expand(y_ext, stacks.b, token_slots, stacks.device_ranks)
    assert got.shape == (len(TOKEN_SLOTS), OUT) and got.is_contiguous()
    stacks.a[:, 3] = stacks.b[:, 3] = 0
    stacks.a[5:, 1] = stacks.b[5:, 1] = 0
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: a rounding step of h or y apart at most
    torch.testing.assert_close(got.cpu(), _reference(x, linear, stacks, TOKEN_SLOTS), rtol=tol, atol=tol)
    base = [t for t, s in enumerate(TOKEN_SLOTS) if s < 0]
    assert torch.equal(got[base], y_ext[base, :OUT])  # base-model tokens: the base output, bit for bit


@kernels
@pytest.mark.parametrize("tokens", [9, 130], ids=["expand-kernel", "masked-all-slots"])
def test_hook_on_cuda_layout_equals_the_cpu_product(monkeypatch, tokens: int) -> None:
    """LoraDelta over the folded layout (the expand kernel up to EXPAND_TOKENS tokens, the masked all-slots
    product beyond), fed by LoraBatch.set, equals the CPU hook on the same adapters; with a bias."""
    monkeypatch.setattr(apply, "EXPAND_TOKENS", 64)  # both paths at test sizes
    linear, stacks = _folded(torch.float32, bias=True)
    _equals_the_cpu_hook(linear, stacks, linear.weight, tokens)


def _equals_the_cpu_hook(linear: Linear, stacks: LinearSlots, weight: torch.Tensor, tokens: int) -> None:
    """LoraDelta on the CUDA path (`linear`, `stacks`) equals the CPU hook over `weight` (and the bias) and the same
    adapters, for a step of `tokens` tokens in four sequences of slots 2, none, 0 and 1."""
    counts = [tokens - 8, 1, 4, 3]
    seq_slots = [2, -1, 0, 1]
    cpu_linear = Linear(IN, [("p", OUT)], bias=linear.bias is not None, dtype=torch.float32)
    cpu_linear.weight.data.copy_(weight.cpu())
    if linear.bias is not None:
        cpu_linear.bias.data.copy_(linear.bias.cpu())
    cpu_stacks = LinearSlots(IN, OUT, num_slots=SLOTS, capacity=CAP, device=torch.device("cpu"), dtype=torch.float32)
    cpu_stacks.a.copy_(stacks.a.cpu())
    cpu_stacks.b.copy_(stacks.b.cpu())
    cpu_stacks.used_rank = stacks.used_rank
    x = torch.randn(sum(counts), IN, generator=torch.Generator().manual_seed(3))
    cpu_batch = LoraBatch(SLOTS, torch.device("cpu"), torch.float32)
    cpu_batch.set(counts, seq_slots)
    want = LoraDelta(cpu_batch, cpu_stacks)(x, cpu_linear)
    batch = LoraBatch(SLOTS, torch.device(DEVICE), torch.float32)
    batch.set(counts, seq_slots)
    batch.cuda = True  # the interpreter runs the CUDA path on CPU tensors
    delta = LoraDelta(batch, stacks)
    assert delta.expand is not None
    assert (sum(counts) <= apply.EXPAND_TOKENS) == (tokens == 9)
    got = delta(x.to(DEVICE), linear)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


@kernels
@pytest.mark.parametrize("tokens", [9, 130], ids=["expand-kernel", "masked-all-slots"])
def test_an_fp8_linear_adds_the_updates_to_its_own_product(monkeypatch, tokens: int) -> None:
    """An FP8 Linear keeps its slots' A apart (no 16-bit buffer to fold it under): its own FP8 product, then every
    slot's h beside it, through the same expand kernel or masked product, equals the CPU hook over its dequantized
    weight."""
    from runtime.native.models.fp8 import dequantize, quantize_rows
    from runtime.native.models.fp8_checkpoint import to_fp8_form

    monkeypatch.setattr(apply, "EXPAND_TOKENS", 64)
    linear = Linear(IN, [("p", OUT)], dtype=torch.float32).to(DEVICE)
    to_fp8_form(linear)
    q, scale = quantize_rows(torch.randn(OUT, IN, generator=torch.Generator().manual_seed(7)) * IN**-0.5)
    linear.weight.data.copy_(q)
    linear.weight_scale.data.copy_(scale)
    stacks = LinearSlots(IN, OUT, num_slots=SLOTS, capacity=CAP, device=torch.device(DEVICE), dtype=torch.float32)
    for slot, spec in enumerate(([(0, OUT, CAP)], [(0, 100, 5)], [(0, OUT, 3), (250, 50, 2)])):
        stacks.write(slot, _pairs(slot, spec, torch.float32))
    _equals_the_cpu_hook(linear, stacks, dequantize(q, scale, torch.float32), tokens)


@on_gpu
def test_lora_hook_in_a_cuda_graph_follows_slot_and_weight_changes() -> None:
    """Captured once with a static slot tensor; replays see new slots and newly written adapters."""
    dtype = torch.bfloat16
    linear, stacks = _folded(dtype)
    stacks.write(3, _pairs(4, [(0, OUT, 2)], dtype))
    batch = LoraBatch(SLOTS, torch.device(DEVICE), dtype)
    delta = LoraDelta(batch, stacks)
    x = torch.randn(len(TOKEN_SLOTS), IN).to(DEVICE, dtype)
    tol = dict(rtol=2e-2, atol=2e-2)

    batch.set([1] * len(TOKEN_SLOTS), TOKEN_SLOTS)  # eager CUDA step first
    torch.testing.assert_close(delta(x, linear).cpu(), _reference(x, linear, stacks, TOKEN_SLOTS), **tol)

    static_slots = torch.full((len(TOKEN_SLOTS),), -1, dtype=torch.long, device=DEVICE)
    batch.bind(static_slots)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        delta(x, linear)  # warm-up (compilation) outside the graph
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = delta(x, linear)
    torch.cuda.current_stream().wait_stream(stream)
    batch.clear()

    for slots in (TOKEN_SLOTS, [3, 3, -1, 1, 0, 2, -1, -1, 3]):
        if slots[0] == 3:
            stacks.write(3, _pairs(9, [(0, OUT, 7)], dtype))  # a new adapter lands in a slot after capture
            stacks.write(1, _pairs(8, [(200, 100, 9)], dtype))  # (ranks within the captured matmul: 12)
        static_slots.copy_(torch.tensor(slots))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out.cpu(), _reference(x, linear, stacks, slots), **tol)
