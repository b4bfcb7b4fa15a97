"""The decode graph's input and output kernels (runtime/native/cuda/step_io.py) vs torch: inputs copied and each row's
token resolved, and greedy ids equal to torch.argmax (ties to the lowest index), in the host buffer too.

On a CUDA machine they run on the GPU with pinned host buffers (read and written by the kernels directly);
without CUDA in Triton's interpreter (tests/triton_interpreter.py).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
from tests.triton_interpreter import RUN_HERE, kernels, run_in_interpreter  # noqa: E402

from runtime.native.decode_rows import IDS, PACKED_ROWS, PREV  # noqa: E402

if RUN_HERE:
    from runtime.native.cuda.step_io import GreedyIds, load_step_inputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PIN = torch.cuda.is_available()


def test_kernels_in_triton_interpreter() -> None:
    run_in_interpreter(__file__, passed=3)


@kernels
def test_inputs_are_copied_and_pending_rows_take_the_previous_ids() -> None:
    max_rows, tables = 8, 40
    host = torch.randint(0, 1000, (2 * PACKED_ROWS * max_rows + tables,), dtype=torch.int32)
    packed = host[: 2 * PACKED_ROWS * max_rows].view(torch.int64).view(PACKED_ROWS, max_rows)
    packed[IDS] = torch.arange(100, 100 + max_rows)
    packed[PREV] = torch.tensor([-1, 3, 0, -1, 2, -1, -1, -1])
    if PIN:
        host = host.pin_memory()
    sampled = torch.tensor([7, 8, 9, 10, 11, 12, 13, 14], device=DEVICE)
    device = torch.zeros_like(host, device=DEVICE)
    ids = torch.full((max_rows,), -5, dtype=torch.long, device=DEVICE)
    count = host.numel() - 7
    load_step_inputs(host, device, count, sampled, ids, 5, max_rows)
    assert torch.equal(device[:count].cpu(), host[:count]) and device[count:].eq(0).all()
    assert ids.tolist() == [100, 10, 7, 103, 9, -5, -5, -5]  # rows past the 5th are left alone


@kernels
@pytest.mark.parametrize("vocab", [1000, 5003])
def test_greedy_ids_are_torch_argmax_with_ties_to_the_lowest_index(vocab: int) -> None:
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn((6, vocab), generator=gen)
    logits[1, 17] = logits[1, vocab - 3] = logits[1].max() + 1  # a tie across chunks
    logits[2, 40] = logits[2, 41] = logits[2].max() + 1  # a tie inside one block
    logits[3] = 0.5  # every logit equal
    logits[4, vocab - 1] = 100.0  # the last one
    logits = logits.to(DEVICE)
    sampled = torch.full((8,), -1, dtype=torch.long, device=DEVICE)
    host = torch.full((8,), -1, dtype=torch.long)
    if PIN:
        host = host.pin_memory()
    greedy = GreedyIds(8, vocab, torch.device(DEVICE))
    greedy(logits[:5], sampled, host)
    if PIN:
        torch.cuda.synchronize()
    expected = logits[:5].argmax(dim=-1).tolist()
    assert expected[1:5] == [17, 40, 0, vocab - 1]
    assert sampled.tolist() == host.tolist() == expected + [-1, -1, -1]
