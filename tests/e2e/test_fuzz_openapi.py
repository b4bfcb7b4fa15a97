"""Schemathesis fuzzing against our own /openapi.json: no 5xx, every answer in its documented shape.

Every operation of the document is fuzzed: OpenAI, Triton (generate, generate_stream, KServe metadata)
and LoRA load/unload. Bounded (a fixed number of derandomised cases per operation) to stay around a
minute on 2 cores. Positive cases follow the request schemas; negative ones break them (wrong types,
missing fields, out-of-range numbers) and must come back as 4xx with the error object of the route's
dialect: OpenAI's under /v1, Triton's {"error": "..."} under /v2.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from adapters.openai.responses import ErrorResponse  # noqa: E402
from tests.e2e.conftest import MODEL_NAME, RunningServer, launch  # noqa: E402

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance]
# (positive, negative) cases per operation: generation routes cost a forward pass each, reads nothing.
GENERATE = (40, 24)
TRITON = (24, 16)
CHEAP = (10, 10)
READ = (8, 0)


@pytest.fixture(scope="module")
def fuzz_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # A short context keeps every generated request cheap (max_tokens, n and prompts are fuzzed too).
    # LoRA loading is on, confined to an empty folder: fuzzed paths and names meet the real checks.
    lora_root = tmp_path_factory.mktemp("lora-root")
    srv = launch(tiny_model_dir, "native", gateway=dict(enable_lora_loading=True, lora_root=[str(lora_root)]),
                 max_model_len=48)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def api_schema(fuzz_server: RunningServer) -> Any:
    document = httpx.get(fuzz_server.url + "/openapi.json").json()
    return schemathesis.openapi.from_dict(document)


def assert_documented_error(path: str, response: Any) -> None:
    """4xx answers carry exactly the error object of the route's dialect."""
    if response.status_code < 400 or path == "/v2/health/ready":  # Triton's readiness 400 has no body
        return
    assert response.headers.get("content-type", [""])[0].startswith("application/json")
    if path.startswith("/v2"):
        body = response.json()
        assert list(body) == ["error"] and isinstance(body["error"], str) and body["error"]
    else:
        ErrorResponse.model_validate(response.json())


def fuzz(schema: Any, server: RunningServer, method: str, path: str, mode: GenerationMode,
         budget: tuple[int, int]) -> None:
    operation = schema[path][method]
    examples = budget[0] if mode is GenerationMode.POSITIVE else budget[1]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case: Any) -> None:
        response = case.call_and_validate(base_url=server.url, checks=CHECKS, timeout=60)
        assert_documented_error(path, response)
        if mode is GenerationMode.POSITIVE and path.startswith("/v2") and response.status_code == 400:
            # the document names only inputs the server knows
            assert "unexpected inference input" not in response.json()["error"]
        if mode is GenerationMode.NEGATIVE and isinstance(case.body, dict) and response.status_code == 200:
            # A "negative" body may still be valid for us (e.g. extra fields are ignored, as OpenAI does).
            assert response.headers.get("content-type", [""])[0].split(";")[0] in ("application/json",
                                                                                  "text/event-stream")

    run()


MODES = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]
POSTS = {"/v1/completions": GENERATE, "/v1/chat/completions": GENERATE, "/v1/responses": GENERATE,
         "/v2/models/{model}/generate": TRITON, "/v2/models/{model}/generate_stream": TRITON,
         "/v2/models/tensorrt_llm/generate": TRITON,
         "/v2/models/tensorrt_llm/versions/{version}/generate_stream": TRITON,
         "/v1/load_lora_adapter": CHEAP, "/v1/unload_lora_adapter": CHEAP}


@pytest.mark.parametrize("mode", MODES, ids=str)
@pytest.mark.parametrize("path", list(POSTS))
def test_post_routes(api_schema: Any, fuzz_server: RunningServer, path: str, mode: GenerationMode) -> None:
    fuzz(api_schema, fuzz_server, "POST", path, mode, POSTS[path])


# Random bodies seldom make a valid stream; these do, so every event of each streaming route is checked
# against its documented schema (the chunk or the Triton response, error events included).
STREAMS = {
    "/v1/completions": {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 3, "stream": True, "logprobs": 2,
                        "stream_options": {"include_usage": True}},
    "/v1/chat/completions": {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                             "stream": True, "logprobs": True, "top_logprobs": 2, "n": 2,
                             "stream_options": {"include_usage": True}},
    "/v1/responses": {"model": MODEL_NAME, "input": "hi", "max_output_tokens": 3, "stream": True},
    "/v2/models/{model}/generate_stream": {"text_input": "hi", "max_tokens": 3, "stream": True,
                                           "return_log_probs": True},
    "/v2/models/tensorrt_llm/generate_stream": {"input_ids": [1, 2, 3], "input_lengths": 3,
                                                "request_output_len": 3, "streaming": True},
}


@pytest.mark.parametrize("path", list(STREAMS))
def test_streamed_events_match_the_document(api_schema: Any, fuzz_server: RunningServer, path: str) -> None:
    params = {"path_parameters": {"model": "ensemble"}} if "{model}" in path else {}
    case = api_schema[path]["POST"].Case(body=STREAMS[path], **params)
    response = case.call_and_validate(base_url=fuzz_server.url, checks=CHECKS, timeout=60)
    assert response.status_code == 200 and response.text.count("data: ") >= 1  # tokens waiting together share one


def test_document_lists_every_route(api_schema: Any, fuzz_server: RunningServer) -> None:
    documented = {(p, m.upper()) for p, item in api_schema.raw_schema["paths"].items() for m in item}
    served = {(route.path, method) for route in fuzz_server.app.routes if route.path != "/openapi.json"
              for method in getattr(route, "methods", set()) - {"HEAD"}}
    assert served - documented == set()


def read_paths() -> list[str]:
    from gateway.openapi import openapi_document

    return [p for p, item in openapi_document()["paths"].items() if "get" in item]


@pytest.mark.parametrize("path", read_paths())
def test_read_routes(api_schema: Any, fuzz_server: RunningServer, path: str) -> None:
    fuzz(api_schema, fuzz_server, "GET", path, GenerationMode.POSITIVE, READ)


def test_document_describes_the_real_schemas(api_schema: Any) -> None:
    from adapters.openai.requests import ChatCompletionRequest, CompletionRequest

    components = api_schema.raw_schema["components"]["schemas"]
    for model in (CompletionRequest, ChatCompletionRequest):
        assert set(components[model.__name__]["properties"]) == set(model.model_fields)
