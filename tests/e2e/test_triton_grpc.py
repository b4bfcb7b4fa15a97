"""KServe v2 gRPC and HTTP `infer` driven by tritonclient, the way the Triton TensorRT-LLM backend's client
scripts drive it (inflight_batcher_llm/client/end_to_end_grpc_client.py, inflight_batcher_llm_client.py):
typed tensors with a batch dimension, decoupled streams, the stop signal, batch_index, sequence_index,
LoRA by task id, errors that name the input, and API keys in the `authorization` metadata."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from tests.e2e.conftest import MODEL_NAME, RunningServer, free_port, launch

grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException, np_to_triton_dtype  # noqa: E402

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def grpc_server(tiny_model_dir: Any) -> Iterator[RunningServer]:
    srv = launch(tiny_model_dir, "native", {"grpc_port": free_port()}, engine_process=True)
    yield srv
    srv.stop()


def grpc_url(server: RunningServer) -> str:
    return f"127.0.0.1:{server.settings.grpc_port}"


@pytest.fixture
def client(grpc_server: RunningServer) -> Iterator[Any]:
    with grpcclient.InferenceServerClient(grpc_url(grpc_server)) as c:
        yield c


def tensor(module: Any, name: str, array: np.ndarray, binary: bool = True) -> Any:
    t = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    if module is httpclient:
        t.set_data_from_numpy(array, binary_data=binary)
    else:
        t.set_data_from_numpy(array)
    return t


def text_inputs(module: Any, prompts: list[str], max_tokens: int, **extra: np.ndarray) -> list[Any]:
    """The ensemble's inputs as end_to_end_grpc_client.py prepares them ([batch, 1] each)."""
    arrays = {
        "text_input": np.array([[p] for p in prompts]).astype(object),
        "max_tokens": np.full((len(prompts), 1), max_tokens, dtype=np.int32),
        "end_id": np.full((len(prompts), 1), -1, dtype=np.int32),
        "exclude_input_in_output": np.full((len(prompts), 1), True, dtype=bool),
        **extra,
    }
    return [tensor(module, name, array) for name, array in arrays.items()]


def generate_text(server: RunningServer, prompt: str, max_tokens: int, headers: dict[str, str] | None = None,
                  **extra: Any) -> str:
    """The same request through /generate: the reference every transport must match."""
    body = {"text_input": prompt, "max_tokens": max_tokens, "end_id": -1, "exclude_input_in_output": True, **extra}
    r = httpx.post(server.url + "/v2/models/ensemble/generate", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["text_output"]


class Stream:
    """A decoupled stream: every callback result in arrival order."""

    def __init__(self, client: Any) -> None:
        self.results: queue.Queue[Any] = queue.Queue()
        self.client = client
        client.start_stream(callback=lambda result, error: self.results.put(error or result))

    def close(self) -> list[Any]:
        self.client.stop_stream()  # waits until the server ends the stream
        out = []
        while not self.results.empty():
            out.append(self.results.get())
        return out


def final(result: Any) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


def test_health_metadata_config_index_and_statistics(client: Any, grpc_server: RunningServer) -> None:
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "trtllm-gateway" and "generate" in meta["extensions"]
    for model in ("ensemble", "tensorrt_llm_bls", "tensorrt_llm", "preprocessing", "postprocessing", MODEL_NAME):
        assert client.is_model_ready(model)
    ids = client.get_model_metadata("tensorrt_llm", as_json=True)
    assert {"name": "input_ids", "datatype": "INT32", "shape": ["-1", "-1"]} in ids["inputs"]
    assert ids["platform"] == "tensorrtllm"
    config = client.get_model_config("tensorrt_llm", as_json=True)["config"]
    assert config["model_transaction_policy"] == {"decoupled": True}
    assert config["parameters"]["max_tokens_in_paged_kv_cache"]["string_value"] == "4096"
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {m["name"] for m in index} == {MODEL_NAME, "ensemble", "tensorrt_llm_bls", "tensorrt_llm", "preprocessing",
                                          "postprocessing"}
    assert all(m["state"] == "READY" for m in index)
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("nope")
    assert err.value.status() == "StatusCode.NOT_FOUND" and "'nope'" in err.value.message()


def test_stream_text_to_the_ensemble_matches_generate(client: Any, grpc_server: RunningServer) -> None:
    stream = Stream(client)
    inputs = text_inputs(grpcclient, [PROMPT], 12, stream=np.array([[True]]))
    client.async_stream_infer("ensemble", inputs, request_id="7")
    results = stream.close()
    assert all(not isinstance(r, Exception) for r in results), results
    assert len(results) > 1  # one response per delta
    text = "".join(r.as_numpy("text_output")[0].decode() for r in results)
    assert text == generate_text(grpc_server, PROMPT, 12)
    assert [final(r) for r in results] == [False] * (len(results) - 1) + [True]
    assert {r.get_response().id for r in results} == {"7"}


def test_token_ids_to_tensorrt_llm_with_a_stop_signal(client: Any, grpc_server: RunningServer) -> None:
    """inflight_batcher_llm_client.py --streaming --stop-after-ms: the stop request ends the first early."""
    tok = grpc_server.engine.tokenizer
    ids = np.array([tok.encode(PROMPT)], dtype=np.int32)
    asked = grpc_server.engine.model_info.context_window - ids.shape[1]  # far more than the time to stop takes
    inputs = [tensor(grpcclient, "input_ids", ids),
              tensor(grpcclient, "input_lengths", np.array([[ids.shape[1]]], dtype=np.int32)),
              tensor(grpcclient, "request_output_len", np.array([[asked]], dtype=np.uint32)),
              tensor(grpcclient, "end_id", np.array([[-1]], dtype=np.int32)),
              tensor(grpcclient, "streaming", np.array([[True]]))]
    first_seen = threading.Event()
    results: list[Any] = []

    def callback(result: Any, error: Any) -> None:
        results.append(error or result)
        first_seen.set()

    client.start_stream(callback=callback)
    client.async_stream_infer("tensorrt_llm", inputs, request_id="12345")
    assert first_seen.wait(60)
    stop = [tensor(grpcclient, "input_ids", np.empty([1, 1], dtype=np.int32)),
            tensor(grpcclient, "input_lengths", np.zeros([1, 1], dtype=np.int32)),
            tensor(grpcclient, "request_output_len", np.array([[0]], dtype=np.uint32)),
            tensor(grpcclient, "stop", np.array([[True]]))]
    client.async_stream_infer("tensorrt_llm", stop, request_id="12345")
    client.stop_stream()
    assert all(not isinstance(r, Exception) for r in results), [str(r) for r in results]
    generated = [r for r in results if r.as_numpy("output_ids") is not None]
    cancel = [r for r in results if r.as_numpy("output_ids") is None]
    assert len(cancel) == 1 and final(cancel[0])  # the stop request's own (empty) answer
    tokens = [t for r in generated for t in r.as_numpy("output_ids")[0][0]]
    assert 0 < len(tokens) < asked and final(generated[-1])
    assert tokens == [int(t) for t in np.concatenate([r.as_numpy("output_ids").reshape(-1) for r in generated])]


def test_batched_inputs_are_answered_with_batch_index(client: Any, grpc_server: RunningServer) -> None:
    prompts = [PROMPT, "Hello there"]
    stream = Stream(client)
    client.async_stream_infer("tensorrt_llm_bls", text_inputs(grpcclient, prompts, 5),
                              outputs=[grpcclient.InferRequestedOutput(n) for n in ("text_output", "batch_index")])
    results = stream.close()
    assert len(results) == 2 and final(results[-1])
    by_index = {int(r.as_numpy("batch_index")[0][0]): r.as_numpy("text_output")[0].decode() for r in results}
    assert by_index == {i: generate_text(grpc_server, p, 5) for i, p in enumerate(prompts)}
    assert results[0].as_numpy("cum_log_probs") is None  # only the requested outputs


def test_num_return_sequences_answer_one_response_per_sample(client: Any) -> None:
    stream = Stream(client)
    extra = {"num_return_sequences": np.array([[2]], dtype=np.int32), "top_k": np.array([[50]], dtype=np.int32),
             "random_seed": np.array([[3]], dtype=np.uint64)}
    client.async_stream_infer("ensemble", text_inputs(grpcclient, [PROMPT], 4, **extra))
    results = stream.close()
    assert sorted(int(r.as_numpy("sequence_index")[0][0]) for r in results) == [0, 1]
    assert all(r.as_numpy("text_output").shape == (1,) for r in results)


def test_model_infer_answers_a_whole_batch_and_the_ids_model(client: Any, grpc_server: RunningServer) -> None:
    result = client.infer("ensemble", text_inputs(grpcclient, [PROMPT, "Hi"], 4))
    texts = [t.decode() for t in result.as_numpy("text_output")]
    assert texts == [generate_text(grpc_server, PROMPT, 4), generate_text(grpc_server, "Hi", 4)]
    assert result.as_numpy("batch_index").reshape(-1).tolist() == [0, 1]
    tok = grpc_server.engine.tokenizer
    ids = tok.encode(PROMPT)
    out = client.infer("tensorrt_llm", [
        tensor(grpcclient, "input_ids", np.array([ids], dtype=np.int32)),
        tensor(grpcclient, "input_lengths", np.array([[len(ids)]], dtype=np.int32)),
        tensor(grpcclient, "request_output_len", np.array([[4]], dtype=np.uint32)),
        tensor(grpcclient, "end_id", np.array([[-1]], dtype=np.int32)),
        tensor(grpcclient, "return_log_probs", np.array([[True]]))])
    output_ids = out.as_numpy("output_ids")
    assert output_ids.shape == (1, 1, len(ids) + 4) and output_ids[0][0][:len(ids)].tolist() == ids
    assert tok.decode(output_ids[0][0][len(ids):].tolist()) == generate_text(grpc_server, PROMPT, 4)
    assert out.as_numpy("sequence_length").tolist() == [[len(ids) + 4]]
    log_probs = out.as_numpy("output_log_probs")
    assert log_probs.shape == (1, 1, 4) and (log_probs < 0).all()
    assert out.as_numpy("cum_log_probs")[0][0] == pytest.approx(log_probs.sum(), rel=1e-5)


def test_bad_tensors_get_errors_naming_the_input_and_leave_the_server_healthy(client: Any) -> None:
    bad_dtype = text_inputs(grpcclient, [PROMPT], 4)
    bad_dtype[1] = tensor(grpcclient, "max_tokens", np.array([[4.5]], dtype=np.float32))
    with pytest.raises(InferenceServerException) as err:
        client.infer("ensemble", bad_dtype)
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT" and "'max_tokens'" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.infer("ensemble", [*text_inputs(grpcclient, [PROMPT], 4), tensor(grpcclient, "bogus", np.zeros([1, 1]))])
    assert "'bogus'" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.infer("ensemble", text_inputs(grpcclient, [PROMPT], 4, top_k=np.array([[1], [2]], dtype=np.int32)))
    assert "'top_k'" in err.value.message()
    stream = Stream(client)
    client.async_stream_infer("ensemble", bad_dtype)
    client.async_stream_infer("ensemble", text_inputs(grpcclient, [PROMPT], 3))
    results = stream.close()
    errors = [r for r in results if isinstance(r, InferenceServerException)]
    assert len(errors) == 1 and "'max_tokens'" in errors[0].message()
    assert [r.as_numpy("text_output")[0].decode() for r in results if r not in errors] != []
    assert client.is_server_ready()


def test_statistics_and_metrics_count_grpc_requests(client: Any, grpc_server: RunningServer) -> None:
    before = client.get_inference_statistics("tensorrt_llm_bls", as_json=True)["model_stats"][0]
    client.infer("tensorrt_llm_bls", text_inputs(grpcclient, [PROMPT, "Hi"], 2))
    after = client.get_inference_statistics("tensorrt_llm_bls", as_json=True)["model_stats"][0]
    assert int(after["inference_count"]) - int(before.get("inference_count", 0)) == 2
    assert int(after["execution_count"]) - int(before.get("execution_count", 0)) == 1
    metrics = httpx.get(grpc_server.url + "/metrics").text
    assert 'nv_inference_count{model="tensorrt_llm_bls",version="1"}' in metrics


def test_http_infer_with_binary_and_json_tensors(grpc_server: RunningServer) -> None:
    http = httpclient.InferenceServerClient(grpc_server.url.removeprefix("http://"))
    want = generate_text(grpc_server, PROMPT, 4)
    binary = http.infer("ensemble", text_inputs(httpclient, [PROMPT], 4))  # tritonclient's default: binary
    assert binary.as_numpy("text_output")[0].decode() == want
    as_json = [tensor(httpclient, t.name(), arr, binary=False) for t, arr in zip(
        text_inputs(httpclient, [PROMPT], 4), [np.array([[PROMPT]]).astype(object), np.array([[4]], dtype=np.int32),
                                               np.array([[-1]], dtype=np.int32), np.array([[True]])])]
    out = http.infer("ensemble", as_json, outputs=[httpclient.InferRequestedOutput("text_output", binary_data=False)])
    assert out.get_response()["outputs"][0]["data"] == [want]  # JSON data: text, as Triton writes BYTES
    with pytest.raises(InferenceServerException) as err:
        http.infer("nope", as_json)
    assert "'nope'" in err.value.message()
    r = httpx.post(grpc_server.url + "/v2/models/ensemble/infer",
                   json={"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": [PROMPT]}]})
    assert r.status_code == 400 and r.json() == {"error": "missing required input 'max_tokens' for model 'ensemble'"}


def test_api_key_is_read_from_the_authorization_metadata(tiny_model_dir: Any) -> None:
    srv = launch(tiny_model_dir, "native", {"grpc_port": free_port(), "api_key": ["sekret"]})
    try:
        with grpcclient.InferenceServerClient(grpc_url(srv)) as c:
            assert c.is_server_live()  # probes stay public, as on HTTP
            with pytest.raises(InferenceServerException) as err:
                c.infer("ensemble", text_inputs(grpcclient, [PROMPT], 2))
            assert err.value.status() == "StatusCode.UNAUTHENTICATED"
            auth = {"authorization": "Bearer sekret"}
            out = c.infer("ensemble", text_inputs(grpcclient, [PROMPT], 2), headers=auth)
            assert out.as_numpy("text_output")[0].decode() == generate_text(srv, PROMPT, 2, headers=auth)
    finally:
        srv.stop()


def test_beams_and_guided_decoding_take_the_generate_path(client: Any, grpc_server: RunningServer) -> None:
    beams = client.infer("ensemble", text_inputs(grpcclient, [PROMPT], 4, beam_width=np.array([[2]], dtype=np.int32)))
    texts = beams.as_numpy("text_output")
    assert texts.shape == (2,) and beams.as_numpy("cum_log_probs").shape == (1, 2)
    want = httpx.post(grpc_server.url + "/v2/models/ensemble/generate", timeout=60, json={
        "text_input": PROMPT, "max_tokens": 4, "end_id": -1, "exclude_input_in_output": True, "beam_width": 2}).json()
    assert [t.decode() for t in texts] == want["text_output"]
    guide = {"guided_decoding_guide_type": np.array([["regex"]]).astype(object),
             "guided_decoding_guide": np.array([["[0-9]{3}"]]).astype(object)}
    digits = client.infer("ensemble", text_inputs(grpcclient, [PROMPT], 3, **guide)).as_numpy("text_output")[0]
    assert len(digits) == 3 and digits.decode().isdigit()


def end_to_end_calls(module: Any, client: Any, prompt: str, output_len: int, log_probs: bool = True) -> None:
    """The calls of the backend's tools/inflight_batcher_llm/end_to_end_test.py (test_functionality_ifb, v0.19.0) on
    one prompt: preprocessing -> tensorrt_llm -> postprocessing by hand, then the ensemble, whose text and log
    probs must be the chain's. Its tensors as the script prepares them (tritonclient, [1, 1] each)."""
    def inputs(**arrays: np.ndarray) -> list[Any]:
        return [tensor(module, name, array) for name, array in arrays.items()]

    query, words = np.array([[prompt]]).astype(object), np.array([[""]], dtype=object)
    out_len = np.ones_like(query).astype(np.int32) * output_len
    pre = client.infer("preprocessing", inputs(QUERY=query, BAD_WORDS_DICT=words, STOP_WORDS_DICT=words,
                                               REQUEST_OUTPUT_LEN=out_len), request_id="0")
    flags = {"return_log_probs": np.array([[True]], dtype=bool)} if log_probs else {}
    ids = client.infer("tensorrt_llm", inputs(
        input_ids=pre.as_numpy("INPUT_ID"), decoder_input_ids=pre.as_numpy("DECODER_INPUT_ID"),
        input_lengths=pre.as_numpy("REQUEST_INPUT_LEN"), request_output_len=pre.as_numpy("REQUEST_OUTPUT_LEN"),
        end_id=pre.as_numpy("OUT_END_ID"), pad_id=pre.as_numpy("OUT_PAD_ID"), **flags), request_id="0")
    output_ids, lengths = ids.as_numpy("output_ids").astype(np.int32), ids.as_numpy("sequence_length")
    post = client.infer("postprocessing", inputs(TOKENS_BATCH=output_ids, SEQUENCE_LENGTH=lengths), request_id="0")
    names = ["text_output", *(["cum_log_probs", "output_log_probs"] if log_probs else [])]
    ensemble = client.infer("ensemble", inputs(text_input=query, max_tokens=out_len, bad_words=words, stop_words=words,
                                               **flags),
                            outputs=[module.InferRequestedOutput(name) for name in names], request_id="0")
    assert post.as_numpy("OUTPUT") == ensemble.as_numpy("text_output")
    assert post.as_numpy("OUTPUT")[0].decode().startswith(prompt)  # exclude_input_in_output is false by default
    if log_probs:
        assert ids.as_numpy("cum_log_probs") == ensemble.as_numpy("cum_log_probs")
        assert (ids.as_numpy("output_log_probs") == ensemble.as_numpy("output_log_probs")).all()


@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "http"])
def test_the_backends_end_to_end_script_calls(module: Any, grpc_server: RunningServer) -> None:
    url = grpc_url(grpc_server) if module is grpcclient else grpc_server.url.removeprefix("http://")
    with module.InferenceServerClient(url) as client:
        end_to_end_calls(module, client, PROMPT, 6)
        assert client.get_model_metadata("preprocessing", **({"as_json": True} if module is grpcclient else {}))[
            "platform"] == "python"
    r = httpx.post(grpc_server.url + "/v2/models/preprocessing/generate", json={"QUERY": PROMPT})
    assert (r.status_code, r.json()) == (400, {"error": "model 'preprocessing' answers KServe infer requests "
                                                        "(POST /v2/models/preprocessing/infer), not generate"})


def test_a_taken_grpc_port_fails_the_start_saying_what_to_pass(tiny_model_dir: Any) -> None:
    """`make serve` on a machine where 8001 is taken once failed with no way out named."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        with pytest.raises(RuntimeError, match=r"cannot listen for gRPC on 127\.0\.0\.1:\d+ .*--grpc-port N "
                                               r"\(`make serve GRPC_PORT=N`\), or --grpc-port none"):
            launch(tiny_model_dir, "native", {"grpc_port": taken.getsockname()[1]})
