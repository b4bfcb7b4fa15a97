"""StopStringMatcher: stop strings across push boundaries, hold-back, several strings, flush."""

from __future__ import annotations

import random

import pytest

from runtime.stop import StopStringMatcher


def run(stop: list[str], chunks: list[str], include: bool = False) -> tuple[list[str], str | None, str]:
    """Feed chunks until a match; return (emitted pieces, matched stop string, flush)."""
    m = StopStringMatcher(stop, include_in_output=include)
    pieces: list[str] = []
    for chunk in chunks:
        text, matched = m.push(chunk)
        pieces.append(text)
        if matched is not None:
            return pieces, matched, m.flush()
    return pieces, None, m.flush()


def test_no_stop_strings_passes_text_through() -> None:
    assert run([], ["ab", "c"]) == (["ab", "c"], None, "")


def test_match_inside_one_push() -> None:
    assert run(["END"], ["abcENDxyz"]) == (["abc"], "END", "")
    assert run(["END"], ["abcENDxyz"], include=True) == (["abcEND"], "END", "")


def test_match_split_across_pushes_is_held_back() -> None:
    pieces, matched, rest = run(["</s>"], ["hello <", "/", "s", "> ignored"])
    assert pieces == ["hello ", "", "", ""]
    assert (matched, rest) == ("</s>", "")
    pieces, matched, _ = run(["</s>"], ["hello <", "/", "s", "> ignored"], include=True)
    assert pieces == ["hello ", "", "", "</s>"]


def test_partial_match_released_when_disambiguated() -> None:
    pieces, matched, rest = run(["STOP"], ["go ST", "ill", " on"])
    assert pieces == ["go ", "STill", " on"]
    assert (matched, rest) == (None, "")


def test_flush_returns_held_back_tail() -> None:
    pieces, matched, rest = run(["STOP"], ["the end ST"])
    assert pieces == ["the end "]
    assert (matched, rest) == (None, "ST")


def test_earliest_completed_match_wins() -> None:
    # "bc" completes at offset 3, "abcd" at 4: "bc" ends the text first, whatever the chunking
    assert run(["abcd", "bc"], ["xabcd"]) == (["xa"], "bc", "")
    assert run(["abcd", "bc"], ["x", "a", "b", "c", "d"]) == (["x", "", "", "a"], "bc", "")
    # same end: the one that starts first (the longer) wins
    assert run(["bc", "abc"], ["xabc"]) == (["x"], "abc", "")
    assert run(["bc", "abc"], ["xabc"], include=True) == (["xabc"], "abc", "")
    # the string listed later can win by position
    assert run(["zz", "q"], ["a q zz"]) == (["a "], "q", "")


def test_overlapping_stop_strings_hold_the_longest_possible_prefix() -> None:
    pieces, matched, _ = run(["<|im_end|>", "<|end|>"], ["ok<|", "im", "_end|>"])
    assert pieces == ["ok", "", ""]
    assert matched == "<|im_end|>"
    pieces, matched, rest = run(["<|im_end|>", "<|end|>"], ["ok<|e", "nx"])
    assert pieces == ["ok", "<|enx"]
    assert (matched, rest) == (None, "")


def test_after_a_match_everything_is_dropped() -> None:
    m = StopStringMatcher(["."])
    assert m.push("one. two") == ("one", ".")
    assert m.push("three.") == ("", None)
    assert m.flush() == ""


def test_empty_and_duplicate_stop_strings_are_ignored() -> None:
    assert run(["", "x", "x"], ["abxc"]) == (["ab"], "x", "")


@pytest.mark.parametrize("include", [False, True])
def test_any_chunking_gives_the_same_result(include: bool) -> None:
    rng = random.Random(0)
    stops = ["ab", "bca", "cc", "abcab"]
    for _ in range(300):
        text = "".join(rng.choice("abcx") for _ in range(rng.randrange(1, 20)))
        cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randrange(0, 5))))
        chunks = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
        one_by_one = run(stops, list(text), include)
        chunked = run(stops, chunks, include)
        assert "".join(chunked[0]) + chunked[2] == "".join(one_by_one[0]) + one_by_one[2]
        assert chunked[1] == one_by_one[1]
        # reference: the smallest end offset, then the smallest start
        found = [(text.find(s) + len(s), text.find(s), s) for s in stops if s in text]
        if found:
            end, start, s = min(found)
            assert chunked[1] == s
            assert "".join(chunked[0]) == text[: end if include else start]
        else:
            assert "".join(chunked[0]) + chunked[2] == text
