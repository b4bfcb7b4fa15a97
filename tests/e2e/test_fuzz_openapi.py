"""Schemathesis fuzzing against our own /openapi.json: no 5xx, every answer in its documented shape.

Bounded (a fixed number of derandomised cases per operation) to stay well under a minute on 2 cores.
Positive cases follow the request schemas; negative ones break them (wrong types, missing fields,
out-of-range numbers) and must come back as 4xx with OpenAI's error object.
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
    response_schema_conformance,
    status_code_conformance,
)

from adapters.openai.responses import ErrorResponse  # noqa: E402
from tests.e2e.conftest import RunningServer, launch  # noqa: E402

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES = {GenerationMode.POSITIVE: 80, GenerationMode.NEGATIVE: 40}


@pytest.fixture(scope="module")
def fuzz_server(tiny_model_dir: Path) -> Iterator[RunningServer]:
    # A short context keeps every generated request cheap (max_tokens, n and prompts are fuzzed too).
    srv = launch(tiny_model_dir, "native", max_model_len=48)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def api_schema(fuzz_server: RunningServer) -> Any:
    document = httpx.get(fuzz_server.url + "/openapi.json").json()
    return schemathesis.openapi.from_dict(document)


def assert_documented_error(response: Any) -> None:
    """4xx answers carry exactly OpenAI's error object."""
    if response.status_code < 400:
        return
    assert response.headers.get("content-type", [""])[0].startswith("application/json")
    ErrorResponse.model_validate(response.json())


def fuzz(schema: Any, server: RunningServer, method: str, path: str, mode: GenerationMode) -> None:
    operation = schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES[mode], deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case: Any) -> None:
        response = case.call_and_validate(base_url=server.url, checks=CHECKS, timeout=60)
        assert_documented_error(response)
        if mode is GenerationMode.NEGATIVE and isinstance(case.body, dict) and response.status_code == 200:
            # A "negative" body may still be valid for us (e.g. extra fields are ignored, as OpenAI does).
            assert response.headers.get("content-type", [""])[0].split(";")[0] in ("application/json",
                                                                                  "text/event-stream")

    run()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_generation_routes(api_schema: Any, fuzz_server: RunningServer, path: str, mode: GenerationMode) -> None:
    fuzz(api_schema, fuzz_server, "POST", path, mode)


@pytest.mark.parametrize("path", ["/v1/models", "/health"])
def test_read_routes(api_schema: Any, fuzz_server: RunningServer, path: str) -> None:
    fuzz(api_schema, fuzz_server, "GET", path, GenerationMode.POSITIVE)


def test_document_describes_the_real_schemas(api_schema: Any) -> None:
    from adapters.openai.requests import ChatCompletionRequest, CompletionRequest

    components = api_schema.raw_schema["components"]["schemas"]
    for model in (CompletionRequest, ChatCompletionRequest):
        assert set(components[model.__name__]["properties"]) == set(model.model_fields)
