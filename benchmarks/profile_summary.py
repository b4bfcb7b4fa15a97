"""Summarise a py-spy raw (collapsed-stack) profile: where the samples go, by function.

    py-spy record --format raw --threads -o prof.txt -- python -m uvicorn ...
    python -m benchmarks.profile_summary prof.txt --top 30 [--thread MainThread] [--focus gateway/]

Prints the top functions by self samples (the leaf frame) and by inclusive samples (anywhere on
the stack), as percentages of the samples kept.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>.*?):\d+\)$")


def _frame_key(frame: str) -> str:
    """'func (path/file.py:123)' -> 'func (path/file.py)': lines merged per function."""
    m = _FRAME.match(frame)
    return f"{m['func']} ({m['file']})" if m else frame


def summarise(path: str, thread: str | None = None, focus: str | None = None) -> tuple[int, Counter[str], Counter[str]]:
    """(samples kept, self counts, inclusive counts) from a py-spy raw file."""
    self_c: Counter[str] = Counter()
    incl_c: Counter[str] = Counter()
    total = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            stack, _, count_s = line.rstrip("\n").rpartition(" ")
            if not stack or not count_s.isdigit():
                continue
            frames = stack.split(";")
            if thread and not any(thread in fr for fr in frames[:1]):
                continue
            frames = [_frame_key(fr) for fr in frames[1:] if fr] if frames[0].startswith(("thread", "process")) else [_frame_key(fr) for fr in frames]
            if not frames:
                continue
            n = int(count_s)
            total += n
            if focus:  # attribute to the innermost frame whose file matches the focus
                hits = [fr for fr in frames if focus in fr]
                if hits:
                    self_c[hits[-1]] += n
            else:
                self_c[frames[-1]] += n
            for fr in set(frames):
                incl_c[fr] += n
    return total, self_c, incl_c


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile_summary", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--thread", help="keep only stacks of threads whose header contains this (e.g. MainThread)")
    p.add_argument("--focus", help="self time goes to the innermost frame in files containing this (e.g. gateway/)")
    args = p.parse_args(argv)
    total, self_c, incl_c = summarise(args.path, args.thread, args.focus)
    if not total:
        print("no samples", file=sys.stderr)
        return 1
    print(f"{total} samples")
    for title, counter in (("self" if not args.focus else f"innermost frame in {args.focus!r}", self_c), ("inclusive", incl_c)):
        print(f"\n-- top by {title} --")
        for frame, n in counter.most_common(args.top):
            print(f"{100 * n / total:6.1f}%  {frame}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
