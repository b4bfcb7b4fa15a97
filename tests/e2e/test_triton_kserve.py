"""KServe v2 endpoints beside Triton's generate, and Triton's metric families with real values."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gateway.cli import parse_serve_args
from tests.e2e.conftest import MODEL_NAME, RunningServer, free_port, scrape, wait_for
from tests.unit.test_triton_pbtxt import QUICKSTART, make_repo

DOC_EXAMPLE = {"text_input": "What is machine learning?", "max_tokens": 20, "bad_words": "", "stop_words": ""}
LABELS = "model=tensorrt_llm,version=1"


def test_server_metadata_and_health(http: httpx.Client) -> None:
    meta = http.get("/v2").json()
    assert meta["name"] == "trtllm-gateway" and meta["version"]
    assert set(meta["extensions"]) == {"model_configuration", "generate", "model_repository", "statistics"}
    assert http.get("/v2/health/live").status_code == 200
    assert http.get("/v2/health/ready").status_code == 200


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls", MODEL_NAME])
def test_text_model_metadata_lists_what_generate_accepts(http: httpx.Client, model: str) -> None:
    meta = http.get(f"/v2/models/{model}").json()
    assert meta["name"] == model and meta["versions"] == ["1"]
    inputs = {i["name"]: i for i in meta["inputs"]}
    for name in ("text_input", "max_tokens", "bad_words", "stop_words", "end_id", "pad_id", "temperature", "top_k",
                 "top_p", "len_penalty", "repetition_penalty", "min_length", "presence_penalty",
                 "frequency_penalty", "random_seed", "return_log_probs", "return_context_logits",
                 "return_generation_logits", "beam_width", "stream", "exclude_input_in_output",
                 "embedding_bias_words", "embedding_bias_weights", "lora_task_id", "num_draft_tokens"):
        assert name in inputs, name
    assert inputs["text_input"] == {"name": "text_input", "datatype": "BYTES", "shape": [-1, 1]}
    assert {o["name"] for o in meta["outputs"]} >= {"text_output", "cum_log_probs", "output_log_probs",
                                                   "context_logits", "generation_logits", "batch_index"}
    assert http.get(f"/v2/models/{model}/versions/1").json() == meta
    ready = http.get(f"/v2/models/{model}/ready")
    assert (ready.status_code, ready.json()) == (200, {"name": model, "ready": True})


def test_tensorrt_llm_config_shows_the_engine_settings(http: httpx.Client, server: RunningServer) -> None:
    config = http.get("/v2/models/tensorrt_llm/config").json()
    assert (config["name"], config["backend"], config["max_batch_size"]) == ("tensorrt_llm", "tensorrtllm", 8)
    assert {i["name"] for i in config["input"]} >= {"input_ids", "input_lengths", "request_output_len"}
    params = {k: v["string_value"] for k, v in config["parameters"].items()}
    assert params["max_tokens_in_paged_kv_cache"] == "4096"
    assert params["batch_scheduler_policy"] == server.settings.engine.scheduler_policy
    assert params["exclude_input_in_output"] == "false"
    meta = http.get("/v2/models/tensorrt_llm").json()
    assert meta["platform"] == "tensorrtllm" and [o["name"] for o in meta["outputs"]][:2] == ["output_ids",
                                                                                               "sequence_length"]


def test_unknown_models_are_404_in_triton_shape(http: httpx.Client) -> None:
    for path in ("/v2/models/nope", "/v2/models/nope/ready", "/v2/models/nope/config", "/v2/models/ensemble/versions/2"):
        r = http.get(path)
        assert r.status_code == 404 and set(r.json()) == {"error"} and "unknown model" in r.json()["error"], path


def test_metrics_carry_real_values_after_a_request(http: httpx.Client, server: RunningServer,
                                                   backend_name: str) -> None:
    before = scrape(server.url)
    body = {**DOC_EXAMPLE, "text_input": ["What is machine learning?", "Hi"], "max_tokens": 4}
    assert http.post("/v2/models/ensemble/generate", json=body).status_code == 200
    assert http.post("/v2/models/ensemble/generate", json={"text_input": "x", "bogus": 1}).status_code == 400
    iterations = f"nv_trt_llm_general_metrics{{general_type=iteration_counter,{LABELS}}}"
    # TensorRT-LLM publishes iteration stats (memory, KV blocks, counters) asynchronously: let them arrive
    wait_for(lambda: scrape(server.url)[iterations] >= before[iterations] + 4, what="the iteration counter")
    after = scrape(server.url)
    stats = server.engine.stats()
    key = "model=ensemble,version=1"

    def delta(name: str) -> float:  # the parser names a counter's samples NAME_total (the wire has NAME)
        return after[f"{name}_total{{{key}}}"] - before.get(f"{name}_total{{{key}}}", 0.0)

    assert (delta("nv_inference_request_success"), delta("nv_inference_request_failure")) == (1, 1)
    assert (delta("nv_inference_count"), delta("nv_inference_exec_count")) == (2, 1)  # 2 prompts, 1 execution
    for duration in ("request", "queue", "compute_input", "compute_infer"):
        assert delta(f"nv_inference_{duration}_duration_us") > 0, duration
    assert after[f"nv_inference_pending_request_count{{{key}}}"] == 0
    # the backend's families: read from engine.stats() at scrape time
    kv = {t: after[f"nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type={t},{LABELS}}}"]
          for t in ("max", "free", "used", "tokens_per", "fraction")}
    assert kv["max"] == stats.kv_blocks_total and kv["tokens_per"] == stats.kv_tokens_per_block
    if backend_name == "native":  # the fake tensorrt_llm reports no KV cache statistics
        assert kv["max"] == 4096 // 16 and kv["tokens_per"] == 16 and kv["used"] + kv["free"] == kv["max"]
    requests = {t: after.get(f"nv_trt_llm_request_metrics{{model=tensorrt_llm,request_type={t},version=1}}")
                for t in ("active", "max", "scheduled", "context", "waiting")}
    assert requests["max"] == 8 and None not in requests.values()
    assert after[f"nv_trt_llm_general_metrics{{general_type=timestamp,{LABELS}}}"] > 1.6e15  # µs since epoch
    memory = [after[f"nv_trt_llm_runtime_memory_metrics{{memory_type={t},{LABELS}}}"] for t in ("gpu", "cpu", "pinned")]
    assert sum(memory) > 0  # weights + KV cache of the tiny model
    for metric in ("generation_requests", "total_context_tokens", "micro_batch_id"):
        assert f"nv_trt_llm_inflight_batcher_metrics{{inflight_batcher_specific_metric={metric},{LABELS}}}" in after


def test_prefix_reuse_shows_in_usage_and_metrics(http: httpx.Client, server: RunningServer,
                                                 backend_name: str) -> None:
    """KV cache reuse (Triton's enable_kv_cache_reuse): a second prompt sharing a 5-block prefix prefills it
    once; the reused tokens show in usage.prompt_tokens_details and in /metrics."""
    if backend_name != "native":
        pytest.skip("the fake tensorrt_llm has no KV cache to reuse")
    prefix = list(range(40, 120))  # 80 tokens = 5 blocks of 16
    hits = "trtllm_gateway_prefix_cache_hit_tokens_total"

    def complete(last: int) -> dict:
        r = http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": prefix + [last], "max_tokens": 2,
                                               "temperature": 0})
        assert r.status_code == 200, r.text
        return r.json()["usage"]

    complete(5)
    before = scrape(server.url)[hits]
    usage = complete(7)
    assert usage["prompt_tokens"] == 81 and usage["prompt_tokens_details"] == {"cached_tokens": 80}
    assert scrape(server.url)[hits] - before == 80


def test_serving_from_a_triton_model_repository(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`serve --triton-model-repo`: the filled template's parameters drive the engine and the dialect."""
    repo = make_repo(tmp_path, {**QUICKSTART, "engine_dir": str(tiny_model_dir)})
    # the engine in this process (--no-engine-process): the repository's parameters reach it through the same
    # settings; an engine-core process would cost seconds to start here (the shared `server` runs one)
    settings = parse_serve_args(["--triton-model-repo", str(repo), "--device", "cpu", "--dtype", "float32",
                                 "--served-model-name", MODEL_NAME, "--host", "127.0.0.1",
                                 "--port", str(free_port()), "--max-num-tokens", "256", "--no-engine-process"],
                                environ={})
    server = RunningServer(settings).start()
    try:
        stats = server.engine.stats()
        assert (stats.max_batch_size, stats.kv_blocks_total * stats.kv_tokens_per_block) == (64, 2560)
        assert server.engine.config.scheduler_policy == "guaranteed_no_evict"
        # exclude_input_in_output True in the file: the prompt is not repeated unless a request asks
        body = httpx.post(server.url + "/v2/models/ensemble/generate", json=DOC_EXAMPLE, timeout=60).json()
        full = httpx.post(server.url + "/v2/models/ensemble/generate", timeout=60,
                          json={**DOC_EXAMPLE, "exclude_input_in_output": False}).json()
        assert full["text_output"] == DOC_EXAMPLE["text_input"] + body["text_output"]
        config = httpx.get(server.url + "/v2/models/tensorrt_llm/config").json()
        params = {k: v["string_value"] for k, v in config["parameters"].items()}
        assert params["exclude_input_in_output"] == "true" and params["max_tokens_in_paged_kv_cache"] == "2560"
        assert params["batch_scheduler_policy"] == "guaranteed_no_evict" and config["max_batch_size"] == 64
    finally:
        server.stop()


def test_tritonclient_reads_the_repository_index_and_statistics(http: httpx.Client, server: RunningServer) -> None:
    """tritonclient.http, as Triton users call it: the repository index lists every model READY, and the
    statistics count this test's generate requests (one with 2 prompts, one failing) in Triton's shape."""
    tritonclient_http = pytest.importorskip("tritonclient.http")
    client = tritonclient_http.InferenceServerClient(server.url.removeprefix("http://"))
    index = client.get_model_repository_index()
    assert {m["name"] for m in index} == {MODEL_NAME, "ensemble", "tensorrt_llm_bls", "tensorrt_llm", "preprocessing",
                                          "postprocessing"}
    assert all(m["version"] == "1" and m["state"] == "READY" for m in index)

    before = client.get_inference_statistics("tensorrt_llm_bls")["model_stats"][0]
    body = {**DOC_EXAMPLE, "text_input": ["What is machine learning?", "Hi"], "max_tokens": 4}
    assert http.post("/v2/models/tensorrt_llm_bls/generate", json=body).status_code == 200
    assert http.post("/v2/models/tensorrt_llm_bls/generate", json={"text_input": "x", "bogus": 1}).status_code == 400
    after = client.get_inference_statistics("tensorrt_llm_bls")["model_stats"][0]
    assert (after["name"], after["version"]) == ("tensorrt_llm_bls", "1")
    assert after["inference_count"] - before["inference_count"] == 2  # prompts
    assert after["execution_count"] - before["execution_count"] == 1
    stats, earlier = after["inference_stats"], before["inference_stats"]
    assert stats["success"]["count"] - earlier["success"]["count"] == 1
    assert stats["fail"]["count"] - earlier["fail"]["count"] == 1
    for phase in ("success", "queue", "compute_input", "compute_infer"):
        assert stats[phase]["ns"] > earlier[phase]["ns"], phase
    assert after["last_inference"] > 0 and after["last_inference"] >= before["last_inference"]
    every = client.get_inference_statistics()["model_stats"]
    assert {(m["name"], m["version"]) for m in every} == {(m["name"], "1") for m in index}
    assert http.get("/v2/models/nope/stats").status_code == 404
