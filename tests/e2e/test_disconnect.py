"""A client that goes away aborts its generation, and the KV blocks return to the pool (read from /metrics)."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.e2e.conftest import MODEL_NAME, RunningServer, scrape, wait_for

MAX_TOKENS = 240  # the tiny model's context is 256: a long generation, cut short by the disconnect
BODY = {"model": MODEL_NAME, "prompt": "hello", "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}


def _blocks_used(server: RunningServer) -> float:
    return scrape(server.url)["trtllm_gateway_kv_blocks_used"]


def _idle(server: RunningServer) -> bool:
    """No request holds KV blocks. TensorRT-LLM reports KV usage only in iteration stats, which stop
    when it idles (the last one may still show the aborted request): there, wait until generation stops."""
    if server.settings.engine.backend == "trtllm":
        return _generation_stopped(server)
    m = scrape(server.url)
    return m["trtllm_gateway_kv_blocks_used"] == 0 and m["trtllm_gateway_requests_running"] == 0


def _generation_stopped(server: RunningServer, quiet: float = 0.3) -> bool:
    before = server.engine.stats().generation_tokens_total
    time.sleep(quiet)
    return server.engine.stats().generation_tokens_total == before


def test_dropped_stream_aborts_and_frees_blocks(server: RunningServer) -> None:
    wait_for(lambda: _idle(server), what="an idle engine before the test")
    before = server.engine.stats().generation_tokens_total
    with httpx.stream("POST", server.url + "/v1/completions", json={**BODY, "stream": True}, timeout=60) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: {")
        if server.settings.engine.backend == "native":
            assert _blocks_used(server) > 0  # the request holds KV blocks while it runs
    # Leaving the block closed the connection mid-stream.
    wait_for(lambda: _idle(server), what="KV blocks back after the disconnect")
    assert server.engine.stats().generation_tokens_total - before < MAX_TOKENS


def test_dropped_chat_stream_with_n_samples_frees_blocks(server: RunningServer) -> None:
    wait_for(lambda: _idle(server), what="an idle engine before the test")
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "n": 3, "max_tokens": 200,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert next(r.iter_lines()).startswith("data: {")
    wait_for(lambda: _idle(server), what="KV blocks of all 3 samples back")


async def test_dropped_non_streamed_request_aborts_and_frees_blocks(server: RunningServer) -> None:
    wait_for(lambda: _idle(server), what="an idle engine before the test")
    before = server.engine.stats().generation_tokens_total
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
        pending = asyncio.create_task(c.post("/v1/completions", json=BODY))
        while server.engine.stats().generation_tokens_total == before:  # wait until it runs
            assert not pending.done(), pending.result().text
            await asyncio.sleep(0.01)
        pending.cancel()  # closes the connection, as a client that gives up does
        await asyncio.gather(pending, return_exceptions=True)
    await asyncio.to_thread(wait_for, lambda: _idle(server), 10.0, "KV blocks back after the disconnect")
    assert server.engine.stats().generation_tokens_total - before < MAX_TOKENS


def test_client_gone_while_sending_its_body_is_499_not_a_server_error(server: RunningServer) -> None:
    """Found by benchmarks/soak.py: a client that leaves mid-body was answered (and logged) as a 500."""
    import socket
    from urllib.parse import urlsplit

    host, port = urlsplit(server.url).hostname, urlsplit(server.url).port
    paths = {"/v1/completions": "/v1/completions", f"/v2/models/{MODEL_NAME}/generate": "/v2/models/{model}/generate"}
    for path, route in paths.items():
        key = f"trtllm_gateway_requests_total{{endpoint={route},status=499}}"

        def server_errors() -> float:  # other tests on this shared server provoke 500s on purpose
            return sum(v for k, v in scrape(server.url).items() if k.startswith("trtllm_gateway_requests_total{")
                       and f"endpoint={route}," in k and "status=5" in k)

        before, errors_before = scrape(server.url).get(key, 0), server_errors()
        with socket.create_connection((host, port)) as s:  # announces 1000 bytes, sends 10, leaves
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      "Content-Length: 1000\r\n\r\n{\"model\": ".encode())
        wait_for(lambda: scrape(server.url).get(key, 0) == before + 1, what=f"a 499 on {path}")
        assert server_errors() == errors_before
