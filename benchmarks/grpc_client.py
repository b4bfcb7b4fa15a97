"""The load generator's KServe v2 gRPC client: Triton's decoupled ModelStreamInfer through
tritonclient.grpc.aio, with the inputs the Triton generate dialect sends as JSON (one stream per request,
as the backend's end_to_end_grpc_client.py opens one)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from benchmarks.backends import RequestResult, Target
from benchmarks.dataset import Prompt


def _inputs(grpcclient: Any, body: dict[str, Any]) -> list[Any]:
    """The generate body's values as [1, 1] tensors of the backend's datatypes."""
    inputs = []
    for name, value in body.items():
        if isinstance(value, bool):
            array = np.array([[value]])
        elif isinstance(value, int):
            array = np.array([[value]], dtype=np.int32)
        elif isinstance(value, float):
            array = np.array([[value]], dtype=np.float32)
        else:
            array = np.array([[value]]).astype(object)
        tensor = grpcclient.InferInput(name, list(array.shape), "BYTES" if array.dtype == object else
                                       {"bool": "BOOL", "int32": "INT32", "float32": "FP32"}[array.dtype.name])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


class GrpcPool:
    """tritonclient.grpc.aio clients (one channel each), one per request in flight, like load.ClientPool."""

    def __init__(self, target: Target, timeout_s: float) -> None:
        import tritonclient.grpc.aio as grpcclient

        self._module = grpcclient
        self._target = target
        self._timeout = timeout_s
        self._free: list[Any] = []
        self._all: list[Any] = []

    def prefill(self, n: int) -> None:
        while len(self._all) < n:
            self._free.append(self._new_client())

    def _new_client(self) -> Any:
        client = self._module.InferenceServerClient(self._target.grpc_url)
        self._all.append(client)
        return client

    async def send(self, prompt: Prompt) -> RequestResult:
        client = self._free.pop() if self._free else self._new_client()
        try:
            return await asyncio.wait_for(self._send(client, prompt), self._timeout)
        finally:
            self._free.append(client)

    async def _send(self, client: Any, prompt: Prompt) -> RequestResult:
        res = RequestResult(start=time.perf_counter(), prompt_tokens=prompt.prompt_tokens)
        inputs = _inputs(self._module, self._target.body(prompt))

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": self._target.model, "inputs": inputs}

        chunks = 0
        headers = self._target.headers or None
        async for result, error in client.stream_infer(requests(), headers=headers):
            now = time.perf_counter()
            if error is not None:
                res.error = f"stream error: {error}"[:200]
                break
            res.events += 1
            text = result.as_numpy("text_output")
            if text is not None and text.size and text.reshape(-1)[0]:
                chunks += 1
                res.text_event(now)
                if not self._target.stream and self._target.count_tokens:
                    chunks = self._target.count_tokens(text.reshape(-1)[0].decode())
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        res.output_tokens = chunks
        res.ok = not res.error and res.ttft is not None
        if not self._target.stream:
            res.ttft, res.itl = None, []
        res.latency = time.perf_counter() - res.start
        return res

    async def aclose(self) -> None:
        await asyncio.gather(*(c.close() for c in self._all))
