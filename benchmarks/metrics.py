"""Aggregate per-request timings into the reported figures: throughput, TTFT, TPOT, ITL, end-to-end
latency percentiles, errors and goodput under latency targets."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.backends import RequestResult

PERCENTILES = (50, 90, 99)
GOODPUT_KEYS = ("ttft", "tpot", "e2e")


@dataclass(frozen=True)
class Goodput:
    """Latency targets in milliseconds; a request counts toward goodput only if it meets all given ones."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    @classmethod
    def parse(cls, items: list[str]) -> Goodput:
        """From ["ttft:200", "tpot:50", "e2e:2000"]."""
        values: dict[str, float] = {}
        for item in items:
            key, sep, ms = item.partition(":")
            if not sep or key not in GOODPUT_KEYS:
                raise ValueError(f"--goodput expects {'/'.join(GOODPUT_KEYS)}:MS, got {item!r}")
            values[f"{key}_ms"] = float(ms)
        return cls(**values)

    def met(self, r: RequestResult) -> bool:
        checks = ((self.ttft_ms, r.ttft), (self.tpot_ms, r.tpot), (self.e2e_ms, r.latency))
        # a target on a figure this request cannot have (TTFT without streaming) counts as missed
        return r.ok and all(t is None or (v is not None and v * 1000 <= t) for t, v in checks)

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2e_ms))


def _dist_ms(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    a = np.asarray(values) * 1000.0
    out = {"mean": float(a.mean())}
    out.update({f"p{p}": float(np.percentile(a, p)) for p in PERCENTILES})
    return out


def summarize(results: list[RequestResult], duration_s: float, goodput: Goodput | None = None) -> dict[str, Any]:
    """The summary of one run (one concurrency or rate); `duration_s` is the measured wall time."""
    ok = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = sum(max(r.prompt_tokens, 0) for r in ok)
    events = sum(r.events for r in results)
    d = max(duration_s, 1e-9)
    summary: dict[str, Any] = {
        "requests": len(results),
        "completed": len(ok),
        "failed": len(failed),
        "duration_s": duration_s,
        "request_throughput": len(ok) / d,
        "output_token_throughput": out_tokens / d,
        "total_token_throughput": (out_tokens + prompt_tokens) / d,
        "events_per_s": events / d,
        "mean_prompt_tokens": prompt_tokens / len(ok) if ok else 0.0,
        "mean_output_tokens": out_tokens / len(ok) if ok else 0.0,
        "ttft_ms": _dist_ms([r.ttft for r in ok if r.ttft is not None]),
        "tpot_ms": _dist_ms([t for r in ok if (t := r.tpot) is not None]),
        "itl_ms": _dist_ms([g for r in ok for g in r.itl]),
        "e2e_ms": _dist_ms([r.latency for r in ok]),
        "gap_ms": _dist_ms([r.gap for r in ok if r.gap is not None]),
        "errors": dict(Counter(r.error for r in failed).most_common(5)),
    }
    if goodput:
        summary["goodput"] = {
            "targets_ms": {k: v for k, v in vars(goodput).items() if v is not None},
            "request_throughput": sum(goodput.met(r) for r in results) / d,
        }
    return summary
