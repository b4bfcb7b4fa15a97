"""gateway.key_limits: the token bucket's arithmetic (fake clock) and start-up validation of the limits."""

from __future__ import annotations

import pytest

from gateway.auth import AuthPolicy
from gateway.key_limits import TokenBucket, key_limits
from gateway.settings import Settings


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_bucket_admits_while_it_holds_a_token_and_names_the_wait_once_overdrawn() -> None:
    clock = Clock()
    bucket = TokenBucket(60, clock)  # 1 token per second, 60 at most
    assert bucket.retry_after() == 0
    bucket.charge(60)  # empty: one second until one token
    assert bucket.retry_after() == 1
    bucket.charge(20)  # overdrawn by 20: 21 s until one token again
    assert bucket.retry_after() == 21
    clock.now += 20.5
    assert bucket.retry_after() == 1  # 0.5 of a token: rounded up
    clock.now += 0.5
    assert bucket.retry_after() == 0


def test_bucket_refills_up_to_its_capacity_only() -> None:
    clock = Clock()
    bucket = TokenBucket(120, clock)  # 2 tokens per second
    clock.now += 3600  # an idle hour does not bank more than a minute's worth
    bucket.charge(120)
    assert bucket.retry_after() == 1  # 0 left: half a second to one token, rounded up


@pytest.mark.parametrize("field", ["key_max_concurrency", "key_tokens_per_minute"])
def test_a_limit_below_one_is_refused_at_start_up(field: str) -> None:
    settings = Settings(**{field: 0})
    with pytest.raises(ValueError, match="--" + field.replace("_", "-") + " must be at least 1"):
        key_limits(settings, AuthPolicy.from_settings(settings))


def test_no_limits_cost_nothing_per_request() -> None:
    settings = Settings(api_key=["k"])
    assert key_limits(settings, AuthPolicy.from_settings(settings)) is None
