"""The engine tests' references (tests/engine_harness.py): hf_greedy's cache of continuations per model."""

from __future__ import annotations

import torch
from torch import nn

from tests.engine_harness import hf_greedy


class Repeats(nn.Module):
    """A stand-in for a transformers model whose greedy continuation repeats `token`."""

    def __init__(self, token: int) -> None:
        super().__init__()
        self.token = token

    def generate(self, ids: torch.Tensor, max_new_tokens: int, **kwargs: object) -> torch.Tensor:
        return torch.cat([ids, torch.full((1, max_new_tokens), self.token)], dim=1)


def test_a_model_where_a_freed_one_lived_gets_its_own_continuation() -> None:
    """A model loaded at the address of a freed one has that one's id(); keyed by id(), the cache handed it the freed
    model's ids (test_int4.py's awq-64 was once compared against the int4 MoE model's continuation, 65, 145, ...)."""
    for _ in range(100):  # until the allocator hands the freed model's address to the next one (most rounds)
        first = Repeats(7)
        address = id(first)
        assert hf_greedy(first, [1, 2], 3) == [7, 7, 7]
        del first
        second = Repeats(9)
        if id(second) == address:
            break
    assert id(second) == address, "no model reused a freed one's address"
    assert hf_greedy(second, [1, 2], 3) == [9, 9, 9]
