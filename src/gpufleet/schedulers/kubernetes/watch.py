"""A watch-fed cache of nodes and pods (a small informer), so that ``list_nodes`` on every reconciler
pass does not list the whole cluster.

For each resource: list (remember the list's resourceVersion), then watch from it with
``allowWatchBookmarks`` and a server-side timeout; each event updates the cache and the resourceVersion
(BOOKMARK events move it without an object). When the watch ends it resumes from the last
resourceVersion; a ``410 Expired`` (the history was compacted) or any error relists. Every
``resync`` seconds it relists anyway, so a missed event cannot live longer than that. Until the first
list of both resources has succeeded, and after an error until the next good list, :meth:`ready` is
false and the adapter reads from the API server directly (and so reports an unreachable server).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from gpufleet.schedulers.kubernetes.model import meta

log = logging.getLogger(__name__)

_ACTIVE = "status.phase!=Succeeded,status.phase!=Failed"


class _Resource:
    def __init__(self, name: str, list_fn: Callable[..., Any], selector: dict[str, str]) -> None:
        self.name, self.list_fn, self.selector = name, list_fn, selector
        self.items: dict[str, Any] = {}
        self.synced = False
        self.relists = 0
        self.resource_version = ""


class ClusterCache:
    """Nodes and active pods, kept current by watches. ``start()`` it; ``stop()`` ends the threads."""

    def __init__(self, api: k8s.ApiClient, *, node_selector: str = "", resync: float = 300.0,
                 watch_timeout: int = 300, retry_wait: float = 2.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        core = k8s.CoreV1Api(api)
        self._resources = [
            _Resource("nodes", core.list_node, {"label_selector": node_selector} if node_selector else {}),
            _Resource("pods", core.list_pod_for_all_namespaces, {"field_selector": _ACTIVE}),
        ]
        self._resync, self._timeout, self._retry_wait = resync, watch_timeout, retry_wait
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watches: list[watch.Watch] = []

    # ---- the Snapshot protocol ------------------------------------------------------------------
    def ready(self) -> bool:
        with self._lock:
            return all(r.synced for r in self._resources)

    def nodes(self) -> list[k8s.V1Node]:
        return self._items(0)

    def pods(self) -> list[k8s.V1Pod]:
        return self._items(1)

    def relists(self) -> dict[str, int]:
        """How many times each resource was listed (the first list included)."""
        with self._lock:
            return {r.name: r.relists for r in self._resources}

    def resource_version(self, resource: str) -> str:
        with self._lock:
            return next(r.resource_version for r in self._resources if r.name == resource)

    # ---- threads --------------------------------------------------------------------------------
    def start(self) -> ClusterCache:
        for r in self._resources:
            t = threading.Thread(target=self._run, args=(r,), name=f"k8s-watch-{r.name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for w in list(self._watches):
            w.stop()  # type: ignore[no-untyped-call]
        for t in self._threads:
            t.join(timeout=self._timeout + 5)

    def _items(self, index: int) -> list[Any]:
        with self._lock:
            return list(self._resources[index].items.values())

    def _run(self, r: _Resource) -> None:
        while not self._stop.is_set():
            try:
                self._list(r)
                deadline = self._monotonic() + self._resync
                while not self._stop.is_set() and self._monotonic() < deadline:
                    self._watch(r, min(self._timeout, max(1, int(deadline - self._monotonic()))))
            except ApiException as err:
                self._unsync(r)
                if err.status == 410:
                    log.info("watch of %s: resourceVersion expired (410); listing again", r.name)
                    continue
                log.warning("watch of %s failed (%s %s); listing again in %.0fs", r.name, err.status,
                            err.reason, self._retry_wait)
                self._stop.wait(self._retry_wait)
            except Exception as err:  # the API server went away: keep trying, never die
                self._unsync(r)
                log.warning("watch of %s failed (%s); listing again in %.0fs", r.name, err, self._retry_wait)
                self._stop.wait(self._retry_wait)

    def _list(self, r: _Resource) -> None:
        listed = r.list_fn(**r.selector)
        with self._lock:
            r.items = {_key(o): o for o in listed.items}
            r.resource_version = (listed.metadata.resource_version if listed.metadata else "") or ""
            r.synced = True
            r.relists += 1

    def _watch(self, r: _Resource, timeout: int) -> None:
        w = watch.Watch()  # type: ignore[no-untyped-call]
        self._watches.append(w)
        try:
            events = w.stream(r.list_fn, resource_version=r.resource_version,  # type: ignore[no-untyped-call]
                              allow_watch_bookmarks=True, timeout_seconds=timeout, **r.selector)
            for event in events:
                kind, obj = event["type"], event["object"]
                with self._lock:
                    if kind in ("ADDED", "MODIFIED"):
                        r.items[_key(obj)] = obj
                    elif kind == "DELETED":
                        r.items.pop(_key(obj), None)
                    if w.resource_version:  # the client tracks it, BOOKMARK events included
                        r.resource_version = str(w.resource_version)
                if self._stop.is_set():
                    break
        finally:
            self._watches.remove(w)

    def _unsync(self, r: _Resource) -> None:
        with self._lock:
            r.synced = False


def _key(obj: Any) -> str:
    m = meta(obj)
    return f"{m.namespace or ''}/{m.name or ''}"
