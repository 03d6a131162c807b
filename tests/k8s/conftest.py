"""Fixtures for the Kubernetes tests: a fake API server and the adapter talking to it over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.k8s.harness import KubernetesHarness


@pytest.fixture
def kube() -> Iterator[KubernetesHarness]:
    h = KubernetesHarness.create()
    try:
        yield h
    finally:
        h.close()
