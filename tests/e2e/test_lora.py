"""LoRA end to end with the official openai SDK and raw HTTP: `model` picks the adapter, /v1/models lists
adapters with their parent, unknown names are OpenAI 404s, run-time load/unload (vLLM's routes) behind
--enable-lora-loading and --lora-root, Triton's lora_task_id over HTTP, and the LoRA metrics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gateway.settings import Settings
from runtime.config import EngineConfig
from tests.e2e.conftest import DEFAULT_ENGINE_OPTIONS, MODEL_NAME, RunningServer, free_port
from tests.lora_adapters import make_peft_adapter, peft_greedy, trtllm_tensors


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        "root": root,
        "sql": make_peft_adapter(tiny_model_dir, root / "sql", ["q_proj", "v_proj", "down_proj"], r=4, seed=11),
        "poet": make_peft_adapter(tiny_model_dir, root / "poet", ["o_proj", "gate_proj", "up_proj"], r=8, seed=12),
    }


def start(tiny_model_dir: Path, adapters: dict[str, Path], **gateway: object) -> RunningServer:
    engine = EngineConfig(**{**DEFAULT_ENGINE_OPTIONS, "model": str(tiny_model_dir)},
                          lora_modules={"sql": str(adapters["sql"])})
    gateway = {"grpc_port": None, **gateway}
    settings = Settings(host="127.0.0.1", port=free_port(), drain_timeout=0.0, engine=engine, **gateway)
    return RunningServer(settings).start()


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, adapters: dict[str, Path]) -> Iterator[RunningServer]:
    srv = start(tiny_model_dir, adapters, enable_lora_loading=True, lora_root=[str(adapters["root"])])
    yield srv
    srv.stop()


def complete(client: openai.OpenAI, model: str, prompt: list[int], n: int = 8) -> openai.types.Completion:
    return client.completions.create(model=model, prompt=prompt, max_tokens=n, temperature=0,
                                     extra_body={"ignore_eos": True})


def test_model_name_selects_the_adapter_and_models_lists_it(client, server, tiny_model_dir, adapters) -> None:
    prompt = server.engine.tokenizer.encode("The quick brown fox")
    tok = server.engine.tokenizer
    out = complete(client, "sql", prompt)
    assert out.model == "sql"
    assert out.choices[0].text == tok.decode(peft_greedy(tiny_model_dir, adapters["sql"], prompt, 8))
    assert complete(client, MODEL_NAME, prompt).choices[0].text != out.choices[0].text
    cards = {m["id"]: m for m in httpx.get(server.base_url + "/models").json()["data"]}
    assert cards["sql"]["parent"] == MODEL_NAME and cards["sql"]["root"] == str(adapters["sql"])
    assert cards[MODEL_NAME].get("parent") is None


def test_unknown_adapter_is_an_openai_404(client) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        complete(client, "nope", [1, 2, 3])
    assert info.value.body == {"message": "The model `nope` does not exist.", "type": "invalid_request_error",
                               "param": None, "code": "model_not_found"}


def test_load_use_unload_at_run_time(client, server, tiny_model_dir, adapters) -> None:
    url = server.base_url
    prompt = [5, 17, 33, 80, 120]
    r = httpx.post(url + "/load_lora_adapter", json={"lora_name": "poet", "lora_path": str(adapters["poet"])})
    assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'poet' added successfully.")
    assert "poet" in [m.id for m in client.models.list().data]
    want = server.engine.tokenizer.decode(peft_greedy(tiny_model_dir, adapters["poet"], prompt, 8))
    assert complete(client, "poet", prompt).choices[0].text == want
    again = httpx.post(url + "/load_lora_adapter", json={"lora_name": "poet", "lora_path": "poet"})
    assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
    r = httpx.post(url + "/unload_lora_adapter", json={"lora_name": "poet"})
    assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'poet' removed successfully.")
    assert "poet" not in [m.id for m in client.models.list().data]
    with pytest.raises(openai.NotFoundError):
        complete(client, "poet", prompt)
    gone = httpx.post(url + "/unload_lora_adapter", json={"lora_name": "poet"})
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
    # a path relative to the LoRA root works too
    r = httpx.post(url + "/load_lora_adapter", json={"lora_name": "poet2", "lora_path": "poet"})
    assert r.status_code == 200


def test_paths_outside_the_lora_root_and_bad_bodies_are_refused(server, tiny_model_dir) -> None:
    url = server.base_url + "/load_lora_adapter"
    outside = httpx.post(url, json={"lora_name": "x", "lora_path": str(tiny_model_dir)})
    assert outside.status_code == 400
    assert outside.json()["error"]["message"] == (
        f"lora_path '{tiny_model_dir}' is not a folder inside the allowed LoRA roots (--lora-root)")
    escape = httpx.post(url, json={"lora_name": "x", "lora_path": "../"})
    assert escape.status_code == 400
    missing = httpx.post(url, json={"lora_path": "sql"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "lora_name"


def test_a_lone_surrogate_lora_name_is_a_400_and_breaks_nothing(server) -> None:
    """It used to register the adapter, after which GET /v1/models (and the unload) answered 500."""
    for route in ("/load_lora_adapter", "/unload_lora_adapter"):
        r = httpx.post(server.base_url + route, content=rb'{"lora_name": "\ud800", "lora_path": "poet"}',
                       headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "lora_name"
        assert "'lora_name' holds a lone UTF-16 surrogate" in r.json()["error"]["message"]
    models = httpx.get(server.base_url + "/models")
    assert models.status_code == 200 and len(models.json()["data"]) == len(server.engine.lora_adapters()) + 1


@pytest.mark.parametrize("name", [MODEL_NAME, "ensemble", "tensorrt_llm", "tensorrt_llm_bls"])
def test_model_names_cannot_be_loaded_as_adapters(server, name: str) -> None:
    """Requests naming them reach the model (OpenAI's `model`, Triton's path): the adapter would be unreachable."""
    r = httpx.post(server.base_url + "/load_lora_adapter", json={"lora_name": name, "lora_path": "poet"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora_name"
    assert r.json()["error"]["message"].startswith(f"lora_name: the adapter name '{name}' is already a model name")
    assert name not in (server.engine.lora_adapters() or {})


def test_triton_lora_task_id_over_http(server, tiny_model_dir, adapters) -> None:
    """Triton's semantics: an unknown task is a 400 saying so; the first request brings lora_weights and
    lora_config, later ones the id alone; a registered adapter's id (1 for --lora-modules sql) names it."""
    tok = server.engine.tokenizer
    prompt = "The quick brown fox"
    body = {"text_input": prompt, "max_tokens": 6, "end_id": -1, "exclude_input_in_output": True}

    def generate(**lora: object) -> httpx.Response:
        return httpx.post(server.url + "/v2/models/ensemble/generate", json={**body, **lora}, timeout=60)

    unknown = generate(lora_task_id=77)
    assert unknown.status_code == 400 and unknown.json()["error"].startswith("LoRA task 77 not found in cache")
    weights, config = trtllm_tensors(adapters["poet"], 8 / 8, {"o_proj": 4, "gate_proj": 5, "up_proj": 7})
    first = generate(lora_task_id=77, lora_weights=[weights], lora_config=[config])
    later = generate(lora_task_id=77)
    want = tok.decode(peft_greedy(tiny_model_dir, adapters["poet"], tok.encode(prompt), 6))
    assert first.status_code == later.status_code == 200
    assert first.json()["text_output"] == later.json()["text_output"] == want
    registered = generate(lora_task_id=1).json()["text_output"]
    assert registered == tok.decode(peft_greedy(tiny_model_dir, adapters["sql"], tok.encode(prompt), 6))


def test_triton_grpc_lora_by_task_id_and_by_adapter_name(tiny_model_dir, adapters) -> None:
    """tritonclient.grpc as end_to_end_grpc_client.py --lora-path: lora_weights (FP16, as the backend's
    .npy files) and lora_config with a UINT64 task id on the first request, the id alone later; a served
    adapter's name is also a model name (text in, text out through that adapter)."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    import numpy as np
    from tritonclient.utils import np_to_triton_dtype

    srv = start(tiny_model_dir, adapters, grpc_port=free_port())
    tok = srv.engine.tokenizer
    prompt = "The quick brown fox"

    def tensors(**arrays: np.ndarray) -> list:
        base = {"text_input": np.array([[prompt]]).astype(object), "max_tokens": np.array([[6]], dtype=np.int32),
                "end_id": np.array([[-1]], dtype=np.int32), "exclude_input_in_output": np.array([[True]])}
        out = []
        for name, array in {**base, **arrays}.items():
            t = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            t.set_data_from_numpy(array)
            out.append(t)
        return out

    try:
        with grpcclient.InferenceServerClient(f"127.0.0.1:{srv.settings.grpc_port}") as c:
            weights, config = trtllm_tensors(adapters["poet"], 8 / 8, {"o_proj": 4, "gate_proj": 5, "up_proj": 7})
            task = {"lora_task_id": np.array([[88]], dtype=np.uint64)}
            first = c.infer("ensemble", tensors(**task, lora_weights=np.array([weights], dtype=np.float16),
                                                lora_config=np.array([config], dtype=np.int32)))
            later = c.infer("ensemble", tensors(**task))
            poet = tok.decode(peft_greedy(tiny_model_dir, adapters["poet"], tok.encode(prompt), 6))
            fp16 = first.as_numpy("text_output")[0].decode()
            assert later.as_numpy("text_output")[0].decode() == fp16
            assert fp16 == poet
            by_name = c.infer("sql", tensors()).as_numpy("text_output")[0].decode()
            assert by_name == tok.decode(peft_greedy(tiny_model_dir, adapters["sql"], tok.encode(prompt), 6))
            assert "sql" in {m.name for m in c.get_model_repository_index().models}
    finally:
        srv.stop()


def test_metrics_count_adapter_requests(client, server) -> None:
    complete(client, "sql", [1, 2, 3], 2)
    text = httpx.get(server.url + "/metrics").text
    lines = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line.startswith("trtllm")}
    assert lines['trtllm_gateway_lora_requests_total{adapter="sql"}'] >= 1
    assert lines["trtllm_gateway_lora_adapters_loaded"] >= 1
    assert lines["trtllm_gateway_lora_cache_misses_total"] >= 1


def test_run_time_loading_is_off_by_default(tiny_model_dir, adapters) -> None:
    srv = start(tiny_model_dir, adapters)
    try:
        r = httpx.post(srv.base_url + "/load_lora_adapter", json={"lora_name": "p", "lora_path": str(adapters["poet"])})
        assert r.status_code == 404 and "--enable-lora-loading" in r.json()["error"]["message"]
    finally:
        srv.stop()


def test_without_a_lora_root_only_the_caches_lora_folder_serves_and_errors_never_show_resolved_paths(
        tiny_model_dir: Path, adapters: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--enable-lora-loading alone loaded adapters from any folder, and its errors told which paths existed."""
    import shutil

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    srv = start(tiny_model_dir, adapters, enable_lora_loading=True)
    try:
        url = srv.base_url + "/load_lora_adapter"
        root = tmp_path / "cache" / "trtllm-gateway" / "lora"
        outside = httpx.post(url, json={"lora_name": "x", "lora_path": str(adapters["poet"])})
        missing = httpx.post(url, json={"lora_name": "x", "lora_path": str(adapters["root"] / "nope")})
        assert (outside.status_code, missing.status_code) == (400, 400)
        assert outside.json()["error"]["message"].replace(str(adapters["poet"]), "P") == \
            missing.json()["error"]["message"].replace(str(adapters["root"] / "nope"), "P")
        shutil.copytree(adapters["poet"], root / "poet")
        assert httpx.post(url, json={"lora_name": "poet", "lora_path": "poet"}).status_code == 200
        (root / "empty").mkdir()
        (root / "link").symlink_to(root / "empty")
        for given in ("empty", "link"):
            r = httpx.post(url, json={"lora_name": "y", "lora_path": given})
            message = r.json()["error"]["message"]
            assert r.status_code == 400 and f"'{given}'" in message and str(root) not in message, message
    finally:
        srv.stop()
