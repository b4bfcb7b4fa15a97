"""Per-API-key limits through the real server: --key-max-concurrency and --key-tokens-per-minute answer
429 with Retry-After in the caller's dialect, for that key only."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import MODEL_NAME, RunningServer, launch, wait_for

CONC_A, CONC_B, TOK_A, TOK_B, TOK_CUT = "key-conc-a", "key-conc-b", "key-tok-a", "key-tok-b", "key-tok-cut"
TOKENS_PER_MINUTE = 120  # 2 tokens per second
BODY = {"model": MODEL_NAME, "prompt": "count", "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def limited(tiny_model_dir: Path) -> Iterator[RunningServer]:
    srv = launch(tiny_model_dir, "native", gateway=dict(api_key=[CONC_A, CONC_B, TOK_A, TOK_B, TOK_CUT], key_max_concurrency=1,
                                                        key_tokens_per_minute=TOKENS_PER_MINUTE))
    yield srv
    srv.stop()


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_second_request_of_a_key_in_flight_is_429_in_both_dialects(limited: RunningServer) -> None:
    url = limited.url
    with httpx.Client(base_url=url, timeout=60) as c, c.stream(
            "POST", "/v1/completions", headers=auth(CONC_A), json={**BODY, "max_tokens": 40, "stream": True}) as held:
        lines = held.iter_lines()
        assert next(lines).startswith("data: ")  # the key's one request is in flight

        r = c.post("/v1/completions", headers=auth(CONC_A), json={**BODY, "max_tokens": 2})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "requests" and r.json()["error"]["code"] == "rate_limit_exceeded"
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        assert "--key-max-concurrency" in r.json()["error"]["message"]

        t = c.post(f"/v2/models/{MODEL_NAME}/generate", headers=auth(CONC_A),
                   json={"text_input": "x", "max_tokens": 2})
        assert t.status_code == 429 and t.headers["retry-after"] == "1"
        assert list(t.json()) == ["error"] and "--key-max-concurrency" in t.json()["error"]

        other = c.post("/v1/completions", headers=auth(CONC_B), json={**BODY, "max_tokens": 2})
        assert other.status_code == 200  # another key is not affected
        assert c.get("/v1/models", headers=auth(CONC_A)).status_code == 200  # reads are not limited
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"  # the held stream was not disturbed
    after = httpx.post(url + "/v1/completions", headers=auth(CONC_A), json={**BODY, "max_tokens": 2}, timeout=60)
    assert after.status_code == 200  # the slot is free again


def test_token_budget_spent_is_429_with_the_seconds_until_it_refills(limited: RunningServer) -> None:
    url = limited.url
    rate = TOKENS_PER_MINUTE / 60
    used = 0
    start = time.monotonic()
    with httpx.Client(base_url=url, timeout=60, headers=auth(TOK_A)) as c:
        for _ in range(2):  # 120 in the bucket: the first leaves ~17, the second overdraws it
            r = c.post("/v1/completions", json={**BODY, "max_tokens": 100})
            assert r.status_code == 200, r.text
            used += r.json()["usage"]["total_tokens"]
        elapsed = time.monotonic() - start
        refused = c.post("/v1/completions", json={**BODY, "max_tokens": 2})
        t = c.post(f"/v2/models/{MODEL_NAME}/generate", json={"text_input": "x", "max_tokens": 2})
    assert used > TOKENS_PER_MINUTE
    assert refused.status_code == 429
    err = refused.json()["error"]
    assert (err["type"], err["code"], err["param"]) == ("tokens", "rate_limit_exceeded", None)
    # The bucket refilled for at most `elapsed` seconds since the first charge.
    wait = int(refused.headers["retry-after"])
    longest = math.ceil((1 - (TOKENS_PER_MINUTE - used)) / rate)
    shortest = math.ceil((1 - (TOKENS_PER_MINUTE - used + elapsed * rate)) / rate)
    assert shortest - 1 <= wait <= longest and f"try again in {wait}s" in err["message"]
    assert t.status_code == 429 and "--key-tokens-per-minute" in json.loads(t.text)["error"]
    other = httpx.post(url + "/v1/completions", headers=auth(TOK_B), json={**BODY, "max_tokens": 2}, timeout=60)
    assert other.status_code == 200  # another key has its own budget


def test_a_stream_cut_before_its_usage_chunk_is_still_charged(limited: RunningServer) -> None:
    """Disconnecting one event before the end used to dodge the budget (only the final usage was charged):
    the prompt and the tokens delivered so far are charged when the stream closes, however it ends."""
    delivered = 0  # tokens: an event carries several when the client reads slower than they come (a busy machine)
    with httpx.Client(base_url=limited.url, timeout=60, headers=auth(TOK_CUT)) as c:
        body = {**BODY, "max_tokens": 240, "stream": True, "logprobs": 0}  # logprobs: one entry per token
        with c.stream("POST", "/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    delivered += len(json.loads(line[6:])["choices"][0]["logprobs"]["tokens"])
                if delivered >= TOKENS_PER_MINUTE + 10:
                    break  # leaving the block closes the connection mid-stream
        wait_for(lambda: limited.app.state.drain.in_flight == 0, 60, "the server to close the cut stream")
        refused = c.post("/v1/completions", json={**BODY, "max_tokens": 2})
    assert delivered >= TOKENS_PER_MINUTE + 10  # cut then, before the end of its 240 tokens and their usage chunk
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["type"] == "tokens"
