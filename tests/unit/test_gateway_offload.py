"""The routes parse and translate large bodies off the event loop, and Triton list inputs have limits.

A held chat template (or tokenizer call) waits on a threading.Event that a GET /health, answered by the
event loop, releases: while the work ran on the loop (1,000 chat messages held it for 4.7 s, measured
2026-11-24), /health waited behind it and the Event's wait ran out instead.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.settings import Settings
from runtime.tokenizer import Tokenizer
from tests.tiny_models import build_tiny_tokenizer
from tests.unit.test_gateway_app import ScriptedEngine

HELD_FOR = 60.0  # seconds a held call waits for /health before giving up (only reached on failure)


@pytest.fixture
def tokenizer(tmp_path: Path) -> Tokenizer:
    build_tiny_tokenizer(tmp_path)
    return Tokenizer.from_pretrained(str(tmp_path))


@pytest.fixture
def client(tokenizer: Tokenizer):
    with TestClient(create_app(Settings(grpc_port=None, max_bad_words=4, max_stop_strings=2, max_logit_bias=3, max_prompts=2),
                               ScriptedEngine(tokenizer))) as c:
        for _ in range(100):
            if c.get("/health").status_code == 200:
                break
        yield c


def _held_until_health(client: TestClient, post: Any) -> tuple[int, bool]:
    """Run `post` (which enters a call held on `released`) beside GET /health; (post status, released in time)."""
    released, outcome = threading.Event(), []

    def hold() -> None:
        if not outcome:  # the first held call only
            outcome.append(released.wait(HELD_FOR))

    with ThreadPoolExecutor(1) as runner:
        answer = runner.submit(post, hold)
        while not outcome and not answer.done():
            assert client.get("/health").status_code == 200  # answered while the large body is worked on
            released.set()
        return answer.result().status_code, outcome == [True]


def test_a_long_chat_is_rendered_off_the_event_loop(client: TestClient, tokenizer: Tokenizer) -> None:
    real = tokenizer.apply_chat_template

    def post(hold: Any) -> Any:
        def held_template(*args: Any, **kwargs: Any) -> str:
            hold()
            return real(*args, **kwargs)

        tokenizer.apply_chat_template = held_template  # type: ignore[method-assign]
        messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": "x" * 20} for i in range(501)]
        return client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})

    status, released_in_time = _held_until_health(client, post)
    assert (status, released_in_time) == (400, True)  # the tiny context cannot hold 501 messages


def test_triton_embedding_words_are_tokenized_off_the_event_loop(client: TestClient, tokenizer: Tokenizer) -> None:
    real = tokenizer.encode_many

    def post(hold: Any) -> Any:
        def held_encode(texts: Any, add_special_tokens: bool = True) -> list[list[int]]:
            hold()
            return real(texts, add_special_tokens)

        tokenizer.encode_many = held_encode  # type: ignore[method-assign]
        body = {"text_input": "hi " * 5000, "max_tokens": 1, "embedding_bias_words": ["a", "b"],
                "embedding_bias_weights": [1.0, 1.0]}
        return client.post("/v2/models/ensemble/generate", json=body)

    status, released_in_time = _held_until_health(client, post)
    assert (status, released_in_time) == (400, True)  # the tiny context cannot hold the prompt


@pytest.mark.parametrize("inputs, param, message", [
    ({"bad_words": ["a", "b", "c", "d", "e"]}, "bad_words", "number of entries 5, over this server's limit of 4"),
    ({"stop_words": ["a", "b", "c"]}, "stop_words", "number of entries 3, over this server's limit of 2"),
    ({"embedding_bias_words": ["a", "b", "c", "d"], "embedding_bias_weights": [1.0] * 4}, "embedding_bias_words",
     "number of entries 4, over this server's limit of 3"),
    ({"text_input": ["a", "b", "c"]}, "text_input", "batch size 3, over this server's limit of 2"),
    ({"bad_words": ["x" * 257]}, "bad_words", "an entry of length 257, over this server's limit of 256"),
])
def test_triton_list_inputs_over_the_limits_are_400(client: TestClient, inputs: dict[str, Any], param: str,
                                                   message: str) -> None:
    body = {"text_input": "hi", "max_tokens": 1, **inputs}
    r = client.post("/v2/models/ensemble/generate", json=body)
    assert (r.status_code, r.json()) == (400, {"error": f"Invalid value for '{param}': {message}."})
