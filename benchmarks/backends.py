"""How the load generator talks to each API: OpenAI completions, OpenAI chat completions, and the
Triton generate extension, streamed (SSE) or not. Each send returns one RequestResult with timings."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.dataset import Prompt

try:  # orjson parses the per-event JSON several times faster; the client is often the bottleneck
    import orjson

    _loads: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - optional
    import json

    _loads = json.loads

API_KINDS = ("completions", "chat", "triton", "triton-grpc")


@dataclass
class RequestResult:
    """Timings of one request. Times in seconds; `start` is time.perf_counter() at send."""

    ok: bool = False
    start: float = 0.0
    latency: float = 0.0  # end to end
    ttft: float | None = None  # streaming only: time to the first event carrying text
    itl: list[float] = field(default_factory=list)  # gaps between successive text-carrying events
    prompt_tokens: int = -1  # from usage when the server reports it, else the dataset's count
    output_tokens: int = 0  # from usage when reported, else text-carrying events (or re-tokenised text)
    events: int = 0  # SSE data events received, [DONE] excluded
    error: str = ""
    last_text: float = 0.0  # perf_counter() of the last text-carrying event
    # closed loops: time from this stream's previous reply (the client's own turnover) to this send
    gap: float | None = None

    def text_event(self, now: float) -> None:
        """A text-carrying event arrived at `now`: the first sets TTFT, the others add an inter-token gap."""
        if self.ttft is None:
            self.ttft = now - self.start
        else:
            self.itl.append(now - self.last_text)
        self.last_text = now

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first."""
        if self.ttft is None or self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


@dataclass
class Target:
    """Where and how to send: the API dialect, model name and request options."""

    base_url: str
    api: str  # one of API_KINDS
    model: str
    stream: bool = True
    ignore_eos: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # e.g. Authorization
    count_tokens: Callable[[str], int] | None = None  # re-tokenises text when no usage/chunks tell
    grpc_url: str = ""  # host:port of the KServe v2 gRPC service (api "triton-grpc")

    @property
    def path(self) -> str:
        if self.api == "completions":
            return "/v1/completions"
        if self.api == "chat":
            return "/v1/chat/completions"
        return f"/v2/models/{self.model}/generate" + ("_stream" if self.stream else "")

    def body(self, prompt: Prompt) -> dict[str, Any]:
        """The JSON body for `prompt` in this dialect."""
        if self.api.startswith("triton"):
            # exclude_input_in_output: Triton's default echoes the prompt in text_output, which would
            # count as generated tokens when no usage is reported
            body: dict[str, Any] = {"text_input": prompt.text, "max_tokens": prompt.max_tokens, "stream": self.stream,
                                    "exclude_input_in_output": True}
        else:
            body = {"model": self.model, "max_tokens": prompt.max_tokens, "stream": self.stream}
            if self.api == "chat":
                body["messages"] = [{"role": "user", "content": prompt.text}]
            else:
                body["prompt"] = prompt.text
            if self.stream:
                body["stream_options"] = {"include_usage": True}
        if self.ignore_eos and self.api.startswith("triton"):
            body["min_length"] = prompt.max_tokens  # the Triton dialect has no ignore_eos; min = max pins the length
        elif self.ignore_eos:
            body["ignore_eos"] = True  # vLLM's extra field: makes output lengths exact
        body.update(self.extra_body)
        return body


def _text_of(api: str, obj: dict[str, Any]) -> str:
    """The generated text one response object (or stream chunk) carries."""
    if api == "triton":
        return obj.get("text_output") or ""
    choices = obj.get("choices") or ()
    if not choices:
        return ""
    c = choices[0]
    if api == "chat":
        msg = c.get("delta") or c.get("message") or {}
        return msg.get("content") or msg.get("reasoning_content") or ("tool" if msg.get("tool_calls") else "")
    return c.get("text") or ""


def _error_of(obj: dict[str, Any]) -> str | None:
    err = obj.get("error")
    if err is None:
        return None
    return err.get("message", str(err)) if isinstance(err, dict) else str(err)


def _apply_usage(res: RequestResult, obj: dict[str, Any]) -> bool:
    usage = obj.get("usage")
    if not usage:
        return False
    res.output_tokens = int(usage.get("completion_tokens", res.output_tokens))
    res.prompt_tokens = int(usage.get("prompt_tokens", res.prompt_tokens))
    return True


async def send(client: httpx.AsyncClient, target: Target, prompt: Prompt) -> RequestResult:
    """Send one request and time it; never raises for HTTP or protocol failures (they land in .error)."""
    res = RequestResult(start=time.perf_counter(), prompt_tokens=prompt.prompt_tokens)
    try:
        if target.stream:
            await _send_stream(client, target, prompt, res)
        else:
            await _send_once(client, target, prompt, res)
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        res.ok, res.error = False, f"{type(e).__name__}: {e}"[:200]
    res.latency = time.perf_counter() - res.start
    return res


async def _send_once(client: httpx.AsyncClient, target: Target, prompt: Prompt, res: RequestResult) -> None:
    r = await client.post(target.path, json=target.body(prompt))
    obj = _loads(r.content)
    err = _error_of(obj) if isinstance(obj, dict) else None
    if r.status_code != 200 or err is not None:
        res.error = f"HTTP {r.status_code}: {err or r.text[:200]}"
        return
    if not _apply_usage(res, obj):
        text = _text_of(target.api, obj)
        res.output_tokens = target.count_tokens(text) if target.count_tokens else len(text.split())
    res.ok = True


async def _send_stream(client: httpx.AsyncClient, target: Target, prompt: Prompt, res: RequestResult) -> None:
    async with client.stream("POST", target.path, json=target.body(prompt)) as r:
        if r.status_code != 200:
            res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
            return
        chunks = 0
        usage_seen = False
        buf = b""
        # Our own line splitter over raw bytes: httpx's aiter_lines decodes to str first and costs
        # noticeably more per event, and the client shares the CPU with the server under test.
        async for data in r.aiter_bytes():
            now = time.perf_counter()
            buf += data
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    continue
                res.events += 1
                obj = _loads(payload)
                err = _error_of(obj)
                if err is not None:
                    res.error = f"stream error: {err}"[:200]
                    return
                usage_seen = _apply_usage(res, obj) or usage_seen
                if _text_of(target.api, obj):
                    chunks += 1
                    res.text_event(now)
        if not usage_seen:
            res.output_tokens = chunks
        res.ok = res.ttft is not None or res.output_tokens == 0
        if not res.ok:
            res.error = "stream ended without text"
