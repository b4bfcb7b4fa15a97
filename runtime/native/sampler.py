"""Sampler: picks one token per row from a batch of logits, and reports raw-distribution logprobs.

Pipeline per step (rows are vectorised; only per-request generators are looped over):
1. `processed_logits`: float32 copy -> logits processors (runtime/native/logits_processors.py) -> grammar
   bitmask of guided rows (runtime/native/guided) -> temperature ->
   top_k -> top_p -> min_p. Masked tokens are -inf.
2. `processed_probs`: the distribution each row samples from ([N, V]; one-hot at the argmax for greedy
   rows). Speculative decoding's acceptance test uses the same function.
3. Sampling: greedy rows take the argmax; the others take argmax(probs / E) with E ~ Exp(1) noise, which
   is an exact draw from probs. A row with its own generator draws its noise from it alone, so its samples
   do not depend on the rest of the batch.
4. Logprobs of the raw model distribution (log_softmax of the unprocessed logits, as vLLM's default):
   the chosen token's, and the top-k for k = the largest number any row asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from runtime.native.device import host_tensor, to_device
from runtime.native.guided.bitmask import apply_bitmask, fill_bitmasks
from runtime.native.guided.guide import GuideState
from runtime.native.logits_processors import apply_logits_processors
from runtime.request import SamplingOptions

_MASK64 = (1 << 64) - 1


@dataclass
class SamplingRow:
    """One sequence's sampling state for one step."""

    options: SamplingOptions
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    generator: torch.Generator | None  # per-request seed; None: the sampler's shared generator
    eos_token_ids: Sequence[int]
    bad_words_ids: Sequence[Sequence[int]] = ()
    guide: GuideState | None = None  # grammar-constrained decoding (runtime/native/guided): masks disallowed tokens
    # plain_greedy found the row plain, which it then stays (edits_logits is monotone in the output length): rows
    # are reused step after step, and checking 256 of them every step took 5% of a decode step's host time (H200)
    _plain: bool = field(default=False, init=False, repr=False, compare=False)
    # likewise `_edits` found that nothing edits its logits: a step of such rows skips the processors' passes
    _edits_nothing: bool = field(default=False, init=False, repr=False, compare=False)
    # temperature (1 for a greedy row), top_k (0: off), top_p, min_p: fixed for the request, so made once; a step
    # gathers its rows' into one array, copied to the device at once (processed_logits)
    params: tuple[float, float, float, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        o = self.options
        self.params = (1.0 if o.greedy else float(o.temperature), float(max(o.top_k, 0)), float(o.top_p),
                       float(o.min_p))


@dataclass
class SamplerOutput:
    """Chosen ids and their raw logprobs; top alternatives when any row asked for them."""

    token_ids: torch.Tensor  # long [N]
    logprobs: torch.Tensor | None  # float [N], log-softmax of the raw logits at the chosen id; None when no
    # row asked for logprobs (two more passes over [N, vocab] floats, a fifth of a batch-256 step on the H100)
    top_ids: torch.Tensor | None  # long [N, k] for k = max requested top logprobs (raw distribution)
    top_logprobs: torch.Tensor | None


def make_generator(seed: int | None, index: int, device: torch.device | str) -> torch.Generator | None:
    """A generator for sample `index` of a request seeded with `seed` (None: no seed, no generator).

    Each index gets a distinct, deterministic stream: the seed is (seed, index) mixed by splitmix64,
    a bijection, so distinct indices never share a seed.
    """
    if seed is None:
        return None
    z = (int(seed) * 0x9E3779B97F4A7C15 + int(index)) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    gen = torch.Generator(device=torch.device(device))
    gen.manual_seed(z)
    return gen


def processed_logits(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Float32 [N, V] logits after processors, temperature and top_k/top_p/min_p truncation (-inf)."""
    x = logits.to(torch.float32, copy=True)
    if any(_edits(r) for r in rows):
        x = _edited(logits, x, rows)
    vocab = x.shape[-1]
    host = np.array([r.params for r in rows], dtype=np.float32)  # [N, 4]: temperature, top_k, top_p, min_p
    host[host[:, 1] >= vocab, 1] = 0  # top_k of the whole vocabulary keeps every token
    temps, top_k, top_p, min_p = host.T
    scaled, by_p, by_k, by_min_p = (temps != 1.0).any(), (top_p < 1.0).any(), top_k.any(), (min_p > 0.0).any()
    if not (scaled or by_p or by_k or by_min_p):
        return x
    params = to_device(torch.from_numpy(host), x.device)
    if scaled:
        x.div_(params[:, 0:1])
    if by_p:
        x = _top_k_top_p_sorted(x, params[:, 1].long(), params[:, 2])
    elif by_k:
        _top_k(x, params[:, 1].long(), int(top_k.max()))
    if by_min_p:
        probs = torch.softmax(x, dim=-1)
        x.masked_fill_(probs < params[:, 3:4] * probs.amax(dim=-1, keepdim=True), float("-inf"))
    return x


def _edited(logits: torch.Tensor, x: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """`x` (a float32 copy of `logits`) after the logits processors and grammar masks of `rows`."""
    apply_logits_processors(x, rows)
    # The grammar mask comes last: nothing may lift it (runtime/native/guided/bitmask.py).
    masks = fill_bitmasks([r.guide for r in rows], x.shape[-1]) if any(r.guide for r in rows) else None
    if masks is not None:
        apply_bitmask(x, *masks)
    if any(r.bad_words_ids or len(r.output_token_ids) < r.options.min_tokens for r in rows):
        # A row whose every token got banned cannot be sampled; it falls back to its raw logits
        # (grammar mask kept) rather than producing NaNs. (torch.where: no host sync.)
        dead = torch.isneginf(x).all(dim=-1, keepdim=True)
        fallback = logits.to(torch.float32, copy=True)
        if masks is not None:
            apply_bitmask(fallback, *masks)
        x = torch.where(dead, fallback, x)
    return x


def processed_probs(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Float32 [N, V]: the distribution each row samples from (one-hot at the argmax for greedy rows)."""
    x = processed_logits(logits, rows)
    return _probs(x, _greedy_rows(rows))


def compute_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Raw log_softmax(logits) at token_ids [N], and the top-k (ids, logprobs) best first (k > 0)."""
    x = logits.to(torch.float32)
    lse = torch.logsumexp(x, dim=-1)
    chosen = x.gather(1, token_ids[:, None]).squeeze(1) - lse
    if k <= 0:
        return chosen, None, None
    values, ids = x.topk(min(k, x.shape[-1]), dim=-1)
    return chosen, ids, values - lse[:, None]


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(dim=-1) of [N, V] float logits (the first index of each row's maximum). A few rows on CUDA are
    reduced in two passes: torch's one-pass reduction gives each row to one thread block, which took 27 us
    for a row of 128,256 logits on an H200, 2.5% of a batch-1 decode step."""
    if x.is_cuda and x.shape[0] <= 8 and x.shape[1] % 64 == 0:
        return two_pass_argmax(x, 64)
    return x.argmax(dim=-1)


def two_pass_argmax(x: torch.Tensor, chunks: int) -> torch.Tensor:
    """argmax over the last dim of [N, V] (V a multiple of `chunks`): each chunk's maximum, then the first chunk
    holding the row's; ties go to the lowest index in both passes, as in argmax."""
    rows, vocab = x.shape
    width = vocab // chunks
    best, where = x.view(rows, chunks, width).max(dim=-1)
    chunk = best.argmax(dim=-1, keepdim=True)
    return (chunk * width + where.gather(1, chunk)).squeeze(1)


class Sampler:
    """Chooses the next token of every row in a batch (see the module docstring)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow]) -> SamplerOutput:
        if logits.shape[0] != len(rows):
            raise ValueError(f"{logits.shape[0]} logits rows for {len(rows)} sampling rows")
        greedy = _greedy_rows(rows)
        if len(greedy) == len(rows):
            # temperature and truncation never move a greedy row's argmax: without processors or a
            # grammar, take it from the raw logits (no float32 copy, no per-option passes)
            edited = any(_edits(r) for r in rows)
            token_ids = row_argmax(processed_logits(logits, rows) if edited else logits)
        else:
            probs = _probs(processed_logits(logits, rows), greedy)
            noise = self._noise(probs, rows)
            if greedy:  # one-hot rows: argmax is the greedy token
                noise.index_fill_(0, host_tensor(greedy, torch.long, noise.device), 1.0)
            token_ids = probs.div_(noise).argmax(dim=-1)
        if all(r.options.logprobs is None for r in rows):
            return SamplerOutput(token_ids=token_ids, logprobs=None, top_ids=None, top_logprobs=None)
        k = max(r.options.logprobs or 0 for r in rows)
        chosen, top_ids, top_lp = compute_logprobs(logits, token_ids, k)
        return SamplerOutput(token_ids=token_ids, logprobs=chosen, top_ids=top_ids, top_logprobs=top_lp)

    def _noise(self, probs: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
        """Exp(1) noise [N, V]: shared-generator rows in one draw, seeded rows from their own generator."""
        noise = torch.empty_like(probs)
        if any(r.generator is None and not r.options.greedy for r in rows):
            noise.exponential_(generator=self._shared_generator(probs.device))
        for i, r in enumerate(rows):
            if r.generator is None or r.options.greedy:
                continue
            if r.generator.device == probs.device:
                noise[i].exponential_(generator=r.generator)
            else:  # a generator made for another device: draw there, then move
                row = torch.empty(probs.shape[-1], device=r.generator.device)
                noise[i].copy_(row.exponential_(generator=r.generator))
        # Exp(1) can return exactly 0, which would make p/0 win (or NaN for p = 0).
        return noise.clamp_(min=torch.finfo(noise.dtype).tiny)

    def _shared_generator(self, device: torch.device) -> torch.Generator:
        gen = self._generators.get(device)
        if gen is None:
            gen = torch.Generator(device=device)
            gen.manual_seed(self.seed)
            self._generators[device] = gen
        return gen


def edits_logits(row: SamplingRow) -> bool:
    """Whether a processor or a grammar changes this row's logits (so its argmax may move).

    Monotone in the output length (only min_tokens depends on it, and only while it is short), so a row
    that edits nothing also edits nothing after more tokens (speculative verification relies on it)."""
    o = row.options
    return bool(
        row.guide is not None or row.bad_words_ids or o.logit_bias or len(row.output_token_ids) < o.min_tokens
        or o.repetition_penalty != 1.0 or o.presence_penalty != 0.0 or o.frequency_penalty != 0.0
    )


def _greedy_rows(rows: Sequence[SamplingRow]) -> list[int]:
    return [i for i, r in enumerate(rows) if r.options.greedy]


def _probs(x: torch.Tensor, greedy: list[int]) -> torch.Tensor:
    """Softmax of processed logits; greedy rows become one-hot at their argmax."""
    probs = torch.softmax(x, dim=-1)
    if greedy:
        index = host_tensor(greedy, torch.long, x.device)
        best = x.index_select(0, index).argmax(dim=-1)
        probs.index_copy_(0, index, torch.nn.functional.one_hot(best, x.shape[-1]).to(probs.dtype))
    return probs


def _top_k(x: torch.Tensor, k: torch.Tensor, kmax: int) -> None:
    """Keep tokens whose logit is >= the row's k-th largest (ties kept); k = 0 keeps all."""
    values = x.topk(kmax, dim=-1).values
    kth = values.gather(1, (k.clamp(min=1) - 1)[:, None])
    kth = torch.where(k[:, None] > 0, kth, torch.full_like(kth, float("-inf")))
    x.masked_fill_(x < kth, float("-inf"))


def _top_k_top_p_sorted(x: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """top_k (same tie rule as `_top_k`) then top_p, over one descending sort of each row."""
    sorted_x, order = x.sort(dim=-1, descending=True, stable=True)  # ties: lowest id first, as argmax
    kth = sorted_x.gather(1, (k.clamp(min=1) - 1)[:, None])
    sorted_x.masked_fill_((k[:, None] > 0) & (sorted_x < kth), float("-inf"))
    probs = torch.softmax(sorted_x, dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    # Drop a token once the tokens ranked above it already reach top_p; the best token always stays,
    # and rows with top_p >= 1 are left bit-identical (float cumsums can exceed 1 in the tail).
    drop = (mass_before >= p[:, None]) & (p[:, None] < 1.0)
    drop[:, 0] = False
    sorted_x.masked_fill_(drop, float("-inf"))
    return torch.empty_like(x).scatter_(1, order, sorted_x)


def plain_greedy(rows: Sequence[SamplingRow]) -> bool:
    """Whether every row's token is the argmax of its raw logits, with no logprobs asked: a decode graph's own
    argmax (runtime/native/cuda/graphs.py) is then the step's sample."""
    return all(r._plain or _check_plain(r) for r in rows)


def _check_plain(row: SamplingRow) -> bool:
    row._plain = row.options.greedy and row.options.logprobs is None and not _edits(row)
    return row._plain


def _edits(row: SamplingRow) -> bool:
    """edits_logits, remembered once false (it stays false: see there)."""
    if row._edits_nothing:
        return False
    if edits_logits(row):
        return True
    row._edits_nothing = True
    return False
