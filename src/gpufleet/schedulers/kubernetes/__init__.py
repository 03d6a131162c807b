"""The Kubernetes adapter: the scheduler port over the API server (cordon, taints, node conditions,
evictions through PodDisruptionBudgets), a watch-fed cache, and the CRDs. See docs/kubernetes.md.

The official ``kubernetes`` client is an optional dependency (``pip install 'gpufleet[kubernetes]'``)
and is imported only inside this package."""

from gpufleet.schedulers.kubernetes.adapter import KubernetesScheduler, RateLimit

__all__ = ["KubernetesScheduler", "RateLimit"]
