"""``scheduler = "kubernetes"`` in the controller config drives the Kubernetes adapter (kubeconfig path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.cli.controller import _scheduler
from gpufleet.controller.settings import load_settings
from gpufleet.domain.errors import InvalidInput
from gpufleet.schedulers.kubernetes import KubernetesScheduler
from tests.k8s.fakeapi import FakeKubeAPI
from tests.k8s.harness import node_object

pytestmark = pytest.mark.kubernetes


def kubeconfig(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "{url}"}}}}]
users: [{{name: me, user: {{token: not-checked}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: me}}}}]
current-context: fake
""")
    return path


def test_controller_config_selects_the_kubernetes_adapter(tmp_path: Path) -> None:
    with FakeKubeAPI() as api:
        api.put("nodes", node_object("gpu-a"))
        settings = load_settings(None, scheduler="kubernetes", kubeconfig=kubeconfig(tmp_path, api.url),
                                 kube_watch=False)
        sched, fleet, driving = _scheduler(settings, 0, None)
        assert isinstance(sched, KubernetesScheduler) and fleet is None
        assert api.url in driving
        assert [n.name for n in sched.list_nodes()] == ["gpu-a"]
        with pytest.raises(InvalidInput, match="--sim-nodes"):
            _scheduler(settings, 3, None)
