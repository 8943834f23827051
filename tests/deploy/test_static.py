"""Static checks of the deployment files, each with the tool made for it: hadolint (Dockerfiles),
`docker compose config` (compose files), `kubectl kustomize` | kubernetes-validate (k8s overlays),
yamllint (all YAML), promtool (alert rules, Prometheus config, every dashboard PromQL expression).
Each check also runs once on a deliberately broken input, to show that it can fail."""
from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.deploy.conftest import DOCKER_CONFIG, ROOT, missing, ok, run, tool

DASHBOARD = ROOT / "deploy/grafana/dashboards/nextok.json"
ALERTS = ROOT / "deploy/prometheus/alerts.yml"
OVERLAYS = ["cpu", "gpu"]


# ---- Dockerfiles -------------------------------------------------------------------------------
@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cuda"])
def test_hadolint(dockerfile):
    ok(run([tool("hadolint"), dockerfile]))


def test_hadolint_fails_on_an_unpinned_image():
    proc = run([tool("hadolint"), "-"], stdin="FROM python\nRUN pip install flask\n")
    assert proc.returncode != 0 and "DL3006" in proc.stdout


# ---- compose ------------------------------------------------------------------------------------
def compose(*args: str, stdin: str | None = None):
    docker = tool("docker", "the docker client; no engine is needed")
    env = {"DOCKER_CONFIG": str(DOCKER_CONFIG)} if (DOCKER_CONFIG / "cli-plugins").is_dir() else {}
    if run([docker, "compose", "version"], env=env).returncode != 0:
        missing("the docker compose plugin", "make deploy-tools")
    return run([docker, "compose", *args], stdin=stdin, env=env)


@pytest.mark.parametrize("file", ["docker-compose.simple.yml", "docker-compose.yml"])
def test_compose_config(file):
    ok(compose("-f", file, "config", "-q"))


def test_compose_gpu_profile_reserves_a_gpu_and_drains():
    proc = compose("-f", "docker-compose.yml", "--profile", "gpu", "config", "--format", "json")
    ok(proc)
    svc = json.loads(proc.stdout)["services"]["nextok-gpu"]
    (dev,) = svc["deploy"]["resources"]["reservations"]["devices"]
    assert dev["driver"] == "nvidia" and "gpu" in dev["capabilities"]
    assert svc["build"]["dockerfile"] == "Dockerfile.cuda"
    assert svc["stop_grace_period"] == "40s"  # > nextok's 30 s --shutdown-timeout


def test_compose_config_fails_on_an_unknown_key():
    proc = compose("-f", "-", "config", "-q", stdin="services:\n  a:\n    imagee: x\n")
    assert proc.returncode != 0 and "imagee" in proc.stderr


# ---- Kubernetes -----------------------------------------------------------------------------------
def kustomize(overlay: str) -> str:
    proc = run([tool("kubectl"), "kustomize", f"deploy/k8s/overlays/{overlay}"])
    ok(proc)
    return proc.stdout


def k8s_validate(manifests: str):
    return run([tool("kubernetes-validate"), "--strict", "--quiet", "-"], stdin=manifests)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kustomize_renders_valid_kubernetes(overlay):
    ok(k8s_validate(kustomize(overlay)))


def test_kubernetes_validate_fails_on_a_bad_field():
    proc = k8s_validate(kustomize("cpu").replace("replicas: 3", "replicas: three"))
    assert proc.returncode != 0 and "replicas" in proc.stdout + proc.stderr


def _objects(overlay: str) -> dict[str, dict]:
    return {d["kind"]: d for d in yaml.safe_load_all(kustomize(overlay)) if d}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_k8s_probes_and_graceful_termination(overlay):
    pod = _objects(overlay)["Deployment"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "nextok-api-key"
    drain = float(c["args"][c["args"].index("--shutdown-timeout") + 1])
    pre_stop = float(c["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["terminationGracePeriodSeconds"] > pre_stop + drain
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_k8s_cpu_hpa_and_gpu_queue_depth_hpa():
    cpu, gpu = _objects("cpu"), _objects("gpu")
    hpa = cpu["HorizontalPodAutoscaler"]["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (3, 20)
    assert hpa["metrics"][0]["resource"]["target"]["averageUtilization"] == 70
    (metric,) = gpu["HorizontalPodAutoscaler"]["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == "nextok_num_requests_waiting"
    assert "nextok:num_requests_waiting" in gpu["ConfigMap"]["data"]["config.yaml"]
    (c,) = gpu["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1 and c["image"] == "nextok:cuda"
    assert cpu["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1


# ---- YAML ---------------------------------------------------------------------------------------
def test_yamllint_all_yaml():
    ok(run([tool("yamllint"), "--strict", "-c", ".yamllint.yaml", "."]))


def test_yamllint_fails_on_bad_indentation(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("a:\n   b: 1\n  c: 2\n")
    assert run([tool("yamllint"), "--strict", "-c", ".yamllint.yaml", str(bad)]).returncode != 0


# ---- Prometheus -------------------------------------------------------------------------------------
def promtool(*args: str):
    return run([tool("promtool", "make system-deps"), *args])


def test_promtool_alert_rules_and_config():
    ok(promtool("check", "rules", str(ALERTS)))
    ok(promtool("check", "config", "deploy/prometheus/prometheus.yml"))


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p["targets"]]


def check_exprs(exprs: list[str], tmp_path):
    """promtool parses PromQL only inside rule files: each expression becomes a recording rule.
    Grafana's template variable is replaced by what "All" sends."""
    rules = [{"record": f"dashboard:expr_{i}", "expr": e.replace("$model_name", ".*")}
             for i, e in enumerate(exprs)]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    return promtool("check", "rules", str(path))


def test_every_dashboard_expr_parses(tmp_path):
    exprs = dashboard_exprs()
    assert len(exprs) >= 20
    proc = check_exprs(exprs, tmp_path)
    ok(proc)
    assert f"SUCCESS: {len(exprs)} rules found" in proc.stdout


def test_promtool_fails_on_a_broken_expr(tmp_path):
    proc = check_exprs(["sum(rate(nextok:generation_tokens_total[1m])"], tmp_path)
    assert proc.returncode != 0 and "parse error" in proc.stdout + proc.stderr


def test_dashboard_and_alerts_use_only_exported_metrics():
    from nextok.server.metrics import ServerMetrics

    exported = set()
    for family in ServerMetrics("m").registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        exported |= {family.name + s for s in suffixes}
    text = DASHBOARD.read_text() + ALERTS.read_text()
    used = set(re.findall(r"nextok:[a-z0-9_]+", text))
    assert used and used <= exported, sorted(used - exported)
    for needed in ("nextok:time_to_first_token_seconds_bucket", "nextok:http_requests_total",
                   "nextok:kv_cache_usage_perc", "nextok:prefix_cache_hits_total",
                   "nextok:num_requests_waiting", "nextok:num_preemptions_total",
                   "nextok:device_memory_used_bytes", "nextok:request_time_per_output_token_seconds_bucket",
                   "nextok:e2e_request_latency_seconds_bucket", "nextok:generation_tokens_total"):
        assert needed in used, needed
