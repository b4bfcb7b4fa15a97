"""End-to-end fixtures: the real server (uvicorn in a background thread, free loopback port, real
engine) on a tiny random-weight model from tests/tiny_models.py.

Backends: every test that uses `server` runs once per entry of BACKENDS. To add one, add one line
`"name": Backend(engine_options={...}, setup=...)`: `engine_options` are EngineConfig fields,
`setup` runs once before the first server of that backend starts (e.g. putting a fake package on
sys.path). Tests that need their own server settings use `start_server(backend, **engine_options)`.
"""

from __future__ import annotations

import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import uvicorn

from gateway.app import create_app
from gateway.settings import Settings
from runtime.config import EngineConfig
from runtime.engine import Engine
from tests.ports import free_port
from tests.tiny_models import build_tiny_model

MODEL_NAME = "tiny"
# The client of the tests' polls and scrapes of their local servers. httpx.get builds a client per call, and with it
# an SSL context (the CA bundle parsed: ~20 ms of CPU); a poll every 20 ms kept a core busy while a server started
# (py-spy over the suite, 2026-11-30: 170 s of samples). No kept connections: each poll connects afresh, as before.
POLL = httpx.Client(timeout=2.0, limits=httpx.Limits(max_keepalive_connections=0))
# for the clients tests make by the hundred (the SDK's, a test each): httpx builds an SSL context per client unless
# given one (plain HTTP leaves it unused)
SSL_CONTEXT = ssl.create_default_context()
FAKES = Path(__file__).resolve().parent.parent / "fakes"


def _use_fake_tensorrt_llm() -> None:
    if str(FAKES) not in sys.path:
        sys.path.insert(0, str(FAKES))


@dataclass(frozen=True)
class Backend:
    """How to serve the tiny model with one backend."""

    engine_options: dict[str, Any] = field(default_factory=dict)
    setup: Callable[[], None] = lambda: None


BACKENDS: dict[str, Backend] = {
    "native": Backend({"backend": "native"}),
    # TensorRT-LLM backend over the fake tensorrt_llm (tests/fakes): it runs the same checkpoint with
    # transformers, so the backend's whole mapping is exercised. TensorRT-LLM refuses device=cpu.
    "trtllm": Backend({"backend": "trtllm", "device": "auto"}, setup=_use_fake_tensorrt_llm),
}

# Small everything: 2 CPU cores are shared by the whole team.
# Dedicated servers keep the native engine in their process (an engine-core process costs ~7 s to start and
# stop here); the shared `server` runs it in its own process, as `serve` does.
DEFAULT_ENGINE_OPTIONS: dict[str, Any] = dict(
    device="cpu", dtype="float32", max_batch_size=8, max_num_tokens=512, max_kv_tokens=4096, kv_block_size=16,
    served_model_name=MODEL_NAME, engine_process=False,
)


class RunningServer:
    """A gateway serving on 127.0.0.1:<port> in a daemon thread."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.app = create_app(settings)
        self._server = uvicorn.Server(uvicorn.Config(self.app, host=settings.host, port=settings.port,
                                                     log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self._server.run, name=f"gateway-{settings.port}", daemon=True)

    @property
    def url(self) -> str:
        return self.settings.url

    @property
    def base_url(self) -> str:
        """For OpenAI clients."""
        return self.url + "/v1"

    @property
    def engine(self) -> Engine:
        return self.app.state.engine

    def start(self, timeout: float = 120.0) -> RunningServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.app.state.startup_error:
                raise RuntimeError(f"engine failed to start: {self.app.state.startup_error}")
            try:
                if POLL.get(self.url + "/health").status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"server on {self.url} not ready after {timeout}s")

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)


_SET_UP: set[str] = set()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models"), "llama")


def launch(model_dir: Path, backend: str, gateway: dict[str, Any] | None = None,
           **engine_options: Any) -> RunningServer:
    """Start a server for `backend` on the tiny model with DEFAULT_ENGINE_OPTIONS, overridden by `engine_options`;
    `gateway`: Settings fields (api_key, request_timeout, ...)."""
    spec = BACKENDS[backend]
    if backend not in _SET_UP:
        spec.setup()
        _SET_UP.add(backend)
    options = {**DEFAULT_ENGINE_OPTIONS, "model": str(model_dir), **spec.engine_options, **engine_options}
    gateway = {"grpc_port": None, **(gateway or {})}  # gRPC tests ask for a free port
    settings = Settings(host="127.0.0.1", port=free_port(), drain_timeout=0.0, engine=EngineConfig(**options),
                        **gateway)
    return RunningServer(settings).start()


@pytest.fixture
def start_server(tiny_model_dir: Path) -> Iterator[Callable[..., RunningServer]]:
    """start_server(backend, gateway=None, **engine_options) -> a dedicated RunningServer, stopped after the test."""
    started: list[RunningServer] = []

    def _start(backend: str, gateway: dict[str, Any] | None = None, **engine_options: Any) -> RunningServer:
        started.append(launch(tiny_model_dir, backend, gateway, **engine_options))
        return started[-1]

    yield _start
    for srv in started:
        srv.stop()


@pytest.fixture(scope="session")
def shared_servers() -> Iterator[dict[str, RunningServer]]:
    """{backend: its shared server}, each started by `server` on first use and kept until the session ends. (A
    session fixture parametrized by backend was stopped and started again at each switch of backend, which under
    pytest-xdist's per-file distribution meant twice per test file: 10-20 s each.)"""
    started: dict[str, RunningServer] = {}
    yield started
    for srv in started.values():
        srv.stop()


@pytest.fixture(params=list(BACKENDS))
def server(request: pytest.FixtureRequest, tiny_model_dir: Path,
           shared_servers: dict[str, RunningServer]) -> RunningServer:
    """The shared server of one backend (default options; the native engine core in its own process)."""
    if request.param not in shared_servers:
        shared_servers[request.param] = launch(tiny_model_dir, request.param, engine_process=True)
    return shared_servers[request.param]


@pytest.fixture
def backend_name(server: RunningServer) -> str:
    return server.settings.engine.backend


@pytest.fixture
def http(server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60, verify=SSL_CONTEXT) as c:
        yield c


@pytest.fixture
def client(server: RunningServer) -> openai.OpenAI:
    """The official OpenAI SDK on `server` (no retries, so errors surface as they are)."""
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0,
                         http_client=openai.DefaultHttpxClient(verify=SSL_CONTEXT))


@pytest.fixture
def aclient(server: RunningServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0,
                              http_client=openai.DefaultAsyncHttpxClient(verify=SSL_CONTEXT))


@pytest.fixture(scope="session")
def hf_model(tiny_model_dir: Path) -> Any:
    """The same checkpoint in transformers: the reference for token ids and logprobs."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return model.eval()


def reference_greedy(hf_model: Any, prompt_ids: list[int], max_new_tokens: int) -> tuple[list[int], list[float]]:
    """transformers' greedy continuation of `prompt_ids` (no EOS stop) and each chosen token's logprob."""
    import torch

    ids = list(prompt_ids)
    logprobs = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = hf_model(torch.tensor([ids])).logits[0, -1].float()
            lp = torch.log_softmax(logits, -1)
            nxt = int(torch.argmax(lp))
            ids.append(nxt)
            logprobs.append(float(lp[nxt]))
    return ids[len(prompt_ids):], logprobs


def scrape(url: str) -> dict[str, float]:
    """GET {url}/metrics as {sample name (labels appended as {k=v,...}): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(POLL.get(url + "/metrics", timeout=10).text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def loading(url: str) -> bool:
    """Whether the server at `url` listens and says it is not ready yet (/health 503)."""
    try:
        return POLL.get(url + "/health").status_code == 503
    except httpx.TransportError:
        return False


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll `predicate` every 20 ms until true; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)
