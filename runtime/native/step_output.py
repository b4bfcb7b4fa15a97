"""StepOutput: what one `EngineCore.step()` produced, token-level, for its driver to hand over.

Two parts, in the order a receiver must read them:
- `token_states` / `token_ids`: one more token of each of these requests, which needs no delta of its own
  (`RequestState.add_plain_token`: a request whose output is its ids); a 256-row decode step makes no object per row;
- `deltas`: (request, its new deltas, are they its last) for everything else (first tokens, logprobs, finishes,
  aborts, failures). A token that follows a delta of its request in the same output goes as a delta too, so that
  reading the columns before the deltas keeps every request's order.
The counters say what the step computed, for the engine's statistics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.request import OutputDelta

if TYPE_CHECKING:
    from runtime.native.request_state import RequestState


class StepOutput:
    """One step's outputs (see the module docstring)."""

    __slots__ = (
        "_with_deltas",
        "cached_tokens",
        "deltas",
        "generated_tokens",
        "num_scheduled",
        "prefill_tokens",
        "prompt_tokens",
        "token_ids",
        "token_states",
    )

    def __init__(self) -> None:
        self.token_states: list[RequestState] = []
        self.token_ids: list[int] = []
        self.deltas: list[tuple[RequestState, list[OutputDelta], bool]] = []
        self._with_deltas: set[str] = set()  # requests that have deltas in this output
        self.num_scheduled = 0  # sequences the step ran
        self.generated_tokens = 0  # tokens sampled and kept (after speculative verification and stops)
        self.prompt_tokens = 0  # prompt tokens of requests admitted for the first time
        self.prefill_tokens = 0  # prompt tokens computed (prefix-cache hits excluded)
        self.cached_tokens = 0  # prompt tokens served from the prefix cache

    def add_token(self, state: RequestState, token_id: int) -> None:
        """A token of `state` that needs no delta (a delta when one of the request's is in this output already)."""
        if state.request_id in self._with_deltas:
            self.emit(state, [OutputDelta(state.request_id, 0, [token_id])])
            return
        self.token_states.append(state)
        self.token_ids.append(token_id)

    def emit(self, state: RequestState, deltas: list[OutputDelta], final: bool = False) -> None:
        """`deltas` of `state` (`final`: its last ones), with the request's facts on its first and last delta."""
        state.decorate(deltas)
        self.deltas.append((state, deltas, final))
        self._with_deltas.add(state.request_id)

    def ended(self) -> list[str]:
        """The requests that ended in this output."""
        return [state.request_id for state, _, final in self.deltas if final]

    def __bool__(self) -> bool:
        return bool(self.token_ids or self.deltas)
