"""Per-request size limits shared by both dialects (n, stop strings, bad words, logit bias, messages,
prompts); the numbers come from the server's settings. Each dialect checks its own fields after schema
validation, so a request over a limit gets a 400 naming the field like any other invalid field.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.errors import InvalidRequestError


@dataclass(frozen=True)
class RequestLimits:
    """Upper bounds on one request's fields."""

    max_n: int = 16
    max_stop_strings: int = 16
    max_stop_string_length: int = 256
    max_bad_words: int = 256
    max_logit_bias: int = 300
    max_messages: int = 1024
    max_prompts: int = 256


def over_limit(param: str, what: str, got: int, limit: int) -> InvalidRequestError:
    """The 400 for field `param` being over a limit: `what` names the measure ("number of stop strings")."""
    return InvalidRequestError(f"Invalid value for '{param}': {what} {got}, over this server's limit of {limit}.",
                               param=param)


def check_words(param: str, words: list[str], most: int, longest: int | None = None, noun: str = "entries") -> None:
    """At most `most` words (`noun` in the message), each at most `longest` characters long when given."""
    if len(words) > most:
        raise over_limit(param, f"number of {noun}", len(words), most)
    length = max((len(w) for w in words), default=0)
    if longest is not None and length > longest:
        raise over_limit(param, "an entry of length", length, longest)


__all__ = ["RequestLimits", "check_words", "over_limit"]
