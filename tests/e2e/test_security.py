"""API keys, admin key, request limits and CORS, through the real server (one server for the module)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from tests.e2e.conftest import MODEL_NAME, RunningServer, free_port, launch, scrape

KEYS = ["key-one-7f3a", "key-two-91bc"]
FILE_KEY = "key-from-file-c0de"
ADMIN = "admin-key-55aa"
ORIGIN = "https://app.example"
LIMITS = dict(max_body_bytes=4096, max_json_depth=8, max_n=4, max_stop_strings=2, max_stop_string_length=8,
              max_logit_bias=2, max_messages=3, max_prompts=2)


@pytest.fixture(scope="module")
def secured(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    keys_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys_file.write_text(f"# one key per line\n\n{FILE_KEY}\n")
    srv = launch(tiny_model_dir, "native", gateway=dict(api_key=KEYS, api_keys_file=str(keys_file),
                                                        admin_api_key=[ADMIN], cors_origins=[ORIGIN],
                                                        grpc_port=free_port(), **LIMITS))
    yield srv
    srv.stop()


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def openai_error(r: httpx.Response, status: int, code: str | None, param: str | None = None) -> str:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert (err["code"], err["param"]) == (code, param)
    return err["message"]


# ---- API keys -------------------------------------------------------------------------------------

def test_health_probes_and_metrics_are_public(secured: RunningServer) -> None:
    for path in ("/health", "/metrics", "/v2/health/live", "/v2/health/ready"):  # probes carry no key
        assert httpx.get(secured.url + path).status_code == 200, path


@pytest.mark.parametrize("path", ["/v1/models", "/openapi.json"])
def test_missing_key_is_401_in_openai_shape(secured: RunningServer, path: str) -> None:
    r = httpx.get(secured.url + path)
    assert openai_error(r, 401, "invalid_api_key").startswith("You didn't provide an API key")
    assert r.headers["www-authenticate"] == "Bearer"


def test_wrong_key_is_401_and_not_echoed(secured: RunningServer) -> None:
    r = httpx.post(secured.url + "/v1/completions", headers=auth("guess-123"), json={"prompt": "hi"})
    assert openai_error(r, 401, "invalid_api_key") == "Incorrect API key provided."
    assert "guess-123" not in r.text


def test_non_bearer_scheme_is_401(secured: RunningServer) -> None:
    r = httpx.get(secured.url + "/v1/models", headers={"authorization": f"Basic {KEYS[0]}"})
    openai_error(r, 401, "invalid_api_key")


def test_triton_routes_answer_401_in_triton_shape(secured: RunningServer) -> None:
    r = httpx.post(secured.url + f"/v2/models/{MODEL_NAME}/generate", json={"text_input": "hi"})
    assert r.status_code == 401 and set(r.json()) == {"error"} and isinstance(r.json()["error"], str)


@pytest.mark.parametrize("key", [*KEYS, FILE_KEY, ADMIN])
def test_every_configured_key_works_with_the_sdk(secured: RunningServer, key: str) -> None:
    client = openai.OpenAI(base_url=secured.base_url, api_key=key, max_retries=0)
    out = client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2, temperature=0)
    assert out.usage.completion_tokens <= 2
    assert [m.id for m in client.models.list().data] == [MODEL_NAME]


def test_refused_requests_count_under_their_route(secured: RunningServer) -> None:
    name = "trtllm_gateway_requests_total{endpoint=/v1/models,status=401}"
    before = scrape(secured.url).get(name, 0.0)
    httpx.get(secured.url + "/v1/models")
    assert scrape(secured.url)[name] == before + 1


def test_sdk_with_a_wrong_key_raises_authentication_error(secured: RunningServer) -> None:
    client = openai.OpenAI(base_url=secured.base_url, api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_admin_routes_need_the_admin_key(secured: RunningServer) -> None:
    body = {"lora_name": "x", "lora_path": "/nonexistent"}
    url = secured.url + "/v1/load_lora_adapter"
    openai_error(httpx.post(url, json=body), 401, "invalid_api_key")
    r = httpx.post(url, json=body, headers=auth(KEYS[0]))
    assert "admin API key" in openai_error(r, 403, "insufficient_permissions")
    # The admin key passes authentication; this server does not enable run-time loading, hence 404.
    r = httpx.post(url, json=body, headers=auth(ADMIN))
    assert r.status_code == 404 and "--enable-lora-loading" in r.json()["error"]["message"]


def test_keys_are_never_logged(secured: RunningServer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        httpx.get(secured.url + "/v1/models", headers=auth(KEYS[0]))
        httpx.get(secured.url + "/v1/models", headers=auth("wrong-key-abc"))
        httpx.post(secured.url + "/v1/load_lora_adapter", headers=auth(KEYS[1]), json={})
    assert caplog.records  # the access log did write
    for secret in [*KEYS, ADMIN, "wrong-key-abc"]:
        assert secret not in caplog.text


# ---- limits -----------------------------------------------------------------------------------------

def post(srv: RunningServer, path: str, headers: dict[str, str] | None = None, **kwargs) -> httpx.Response:
    return httpx.post(srv.url + path, headers={**auth(KEYS[0]), **(headers or {})}, timeout=60, **kwargs)


def test_body_over_limit_is_413(secured: RunningServer) -> None:
    body = {"model": MODEL_NAME, "prompt": "x" * 5000}
    r = post(secured, "/v1/completions", json=body)
    assert "4096 bytes" in openai_error(r, 413, "request_too_large")


def test_chunked_body_over_limit_is_413(secured: RunningServer) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit applies while the body streams in
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}'

    r = post(secured, "/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    openai_error(r, 413, "request_too_large")


def test_json_nested_too_deep_is_400(secured: RunningServer) -> None:
    deep = "[" * 9 + "]" * 9
    r = post(secured, "/v1/completions", content=f'{{"prompt": "hi", "x": {deep}}}'.encode())
    assert "nested more than 8 levels" in openai_error(r, 400, None)
    ok = "[" * 6 + "]" * 6
    r = post(secured, "/v1/completions", content=f'{{"prompt": "hi", "max_tokens": 1, "x": {ok}}}'.encode())
    assert r.status_code == 200, r.text


def test_json_nested_past_the_decoder_stack_is_400(secured: RunningServer) -> None:
    r = post(secured, "/v1/completions", content=b"[" * 2000 + b"]" * 2000)
    openai_error(r, 400, None)


CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@pytest.mark.parametrize(("path", "extra", "param", "fragment"), [
    ("/v1/chat/completions", {"n": 5}, "n", "n = 5"),
    ("/v1/chat/completions", {"stop": ["a", "b", "c"]}, "stop", "number of stop strings 3"),
    ("/v1/chat/completions", {"stop": "ninechars"}, "stop", "length 9"),
    ("/v1/chat/completions", {"logit_bias": {"1": 1, "2": 1, "3": 1}}, "logit_bias", "entries 3"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}] * 4}, "messages", "messages 4"),
    ("/v1/completions", {"prompt": ["a", "b", "c"]}, "prompt", "prompts 3"),
    ("/v1/completions", {"prompt": "a", "best_of": 5}, "best_of", "best_of = 5"),
])
def test_field_limits_are_400_naming_the_field(secured: RunningServer, path: str, extra: dict, param: str,
                                               fragment: str) -> None:
    message = openai_error(post(secured, path, json={**CHAT, **extra}), 400, None, param)
    assert fragment in message and "over this server's limit" in message


def test_requests_at_the_limits_pass(secured: RunningServer) -> None:
    body = {**CHAT, "n": 4, "stop": ["abcdefgh", "b"], "logit_bias": {"1": 1, "2": 1},
            "messages": [{"role": "user", "content": "hi"}] * 3}
    r = post(secured, "/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 4


def grpc_infer(srv: RunningServer, key: str | None, text: str, **arrays: np.ndarray) -> Any:
    """A tritonclient ModelInfer of `text` (raises InferenceServerException)."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    named = {"text_input": np.array([[text]]).astype(object), "max_tokens": np.array([[1]], dtype=np.int32), **arrays}
    inputs = []
    for name, array in named.items():
        inputs.append(grpcclient.InferInput(name, list(array.shape), "BYTES" if array.dtype == object else "INT32"))
        inputs[-1].set_data_from_numpy(array)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{srv.settings.grpc_port}") as c:
        return c.infer("ensemble", inputs, headers=auth(key) if key else None)


def test_request_limits_hold_on_grpc_as_on_http(secured: RunningServer) -> None:
    """Every rule holds on every transport: the key, the body size and the field limits, over gRPC ModelInfer."""
    from tritonclient.utils import InferenceServerException

    assert grpc_infer(secured, KEYS[0], "hi").as_numpy("text_output").size == 1
    refusals = [(None, "hi", {}, "UNAUTHENTICATED"),
                (KEYS[0], "y" * 10_000, {}, "RESOURCE_EXHAUSTED"),  # over --max-body-bytes 4096
                (KEYS[0], "hi", {"stop_words": np.array([["a", "b", "c"]]).astype(object)}, "INVALID_ARGUMENT"),
                (KEYS[0], "hi", {"guided_decoding": np.array([["[" * 20 + "]" * 20]]).astype(object)},
                 "INVALID_ARGUMENT")]  # nested past --max-json-depth 8
    for key, text, arrays, status in refusals:
        with pytest.raises(InferenceServerException) as err:
            grpc_infer(secured, key, text, **arrays)
        assert err.value.status() == f"StatusCode.{status}", (status, err.value.message())


def http_infer(srv: RunningServer, key: str, request_id: str, asked: int, stop: bool = False) -> httpx.Response:
    """A KServe /infer call to `tensorrt_llm` of `asked` tokens, or (`stop`) the stop signal of `request_id`."""
    def tensor(name: str, datatype: str, data: list) -> dict[str, Any]:
        return {"name": name, "datatype": datatype, "shape": [1, len(data)], "data": data}

    ids = [] if stop else [5, 6, 7, 8]
    inputs = [tensor("input_ids", "INT32", ids or [0]), tensor("input_lengths", "INT32", [len(ids)]),
              tensor("request_output_len", "UINT32", [0 if stop else asked]), tensor("end_id", "INT32", [-1])]
    if stop:
        inputs.append(tensor("stop", "BOOL", [True]))
    return post(srv, "/v2/models/tensorrt_llm/infer", headers=auth(key), json={"id": request_id, "inputs": inputs})


def test_a_triton_stop_over_http_reaches_only_its_own_keys_request(secured: RunningServer) -> None:
    """Any client could stop another's request by its id. A stop sent before its request is kept for that request
    (issue 40): so another key's stop sent first must not end this one, and the key's own must."""
    asked = 40
    assert http_infer(secured, KEYS[1], "shared-id", 0, stop=True).status_code == 200  # another key's stop
    r = http_infer(secured, KEYS[0], "shared-id", asked)
    assert r.status_code == 200, r.text
    assert len(r.json()["outputs"][0]["data"]) == 4 + asked  # ran to its length (prompt ids included)
    assert http_infer(secured, KEYS[0], "own-id", 0, stop=True).status_code == 200  # its own key's stop
    r = http_infer(secured, KEYS[0], "own-id", asked)
    assert r.status_code == 200 and len(r.json()["outputs"][0]["data"]) < 4 + asked, r.text


# ---- CORS -------------------------------------------------------------------------------------------

def test_cors_preflight_for_an_allowed_origin(secured: RunningServer) -> None:
    r = httpx.options(secured.url + "/v1/chat/completions", headers={
        "origin": ORIGIN, "access-control-request-method": "POST",
        "access-control-request-headers": "authorization,content-type"})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == ORIGIN
    r = post(secured, "/v1/chat/completions", json=CHAT, headers={"origin": ORIGIN})
    assert r.headers["access-control-allow-origin"] == ORIGIN


def test_cors_refuses_other_origins(secured: RunningServer) -> None:
    r = httpx.options(secured.url + "/v1/models", headers={"origin": "https://evil.example",
                                                            "access-control-request-method": "GET"})
    assert "access-control-allow-origin" not in r.headers


def test_cors_is_off_by_default(server: RunningServer) -> None:
    r = httpx.options(server.url + "/v1/models", headers={"origin": ORIGIN, "access-control-request-method": "GET"})
    assert "access-control-allow-origin" not in r.headers
    r = httpx.get(server.url + "/v1/models", headers={"origin": ORIGIN})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
