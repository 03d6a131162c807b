"""An in-process fake of the Kubernetes API server, served over real HTTP on 127.0.0.1.

The official Python client talks to it exactly as it talks to a cluster (``Configuration.host``), so the
adapter under test is the production code path down to the HTTP request. It implements the semantics
the adapter relies on, and no more:

* objects with ``metadata.resourceVersion`` from one cluster-wide counter; a write whose body carries a
  ``resourceVersion`` other than the stored one is refused with 409 Conflict (optimistic concurrency);
* PATCH in the three formats (:mod:`tests.k8s.patch`); a node's main resource ignores
  ``status`` and its ``/status`` subresource ignores everything else (``nodeStrategy`` in the API server);
* the Eviction subresource (``policy/v1``): 200 and the pod is deleted; 429 when a
  PodDisruptionBudget allows no disruption; 500 when more than one budget selects the pod;
* list with ``fieldSelector`` (``spec.nodeName``, ``metadata.name``, ``status.phase``, ``=``/``!=``)
  and ``labelSelector`` (``k=v``, ``k!=v``, ``k``, ``!k``);
* watch from a resourceVersion with ``allowWatchBookmarks`` (BOOKMARK events) and ``timeoutSeconds``;
  a watch from a resourceVersion older than the retained history gets the ``410 Expired`` ERROR event
  (:meth:`FakeKubeAPI.compact` drops the history, as etcd compaction does);
* fault injection for tests: :meth:`FakeKubeAPI.fail_next` (e.g. 503s) and
  :meth:`FakeKubeAPI.before_next_write` (another writer races the next write: a real 409).

Responses follow recorded responses of real API servers; ``tests/k8s/recorded/`` holds them,
with their origin, and ``test_fakeapi.py`` compares the fake against them.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.k8s.patch import PatchError, json_patch, merge_patch, strategic_merge_patch

Obj = dict[str, Any]


@dataclass(frozen=True)
class Kind:
    group_version: str  # "v1", "policy/v1", "gpufleet.io/v1alpha1"
    kind: str
    namespaced: bool


KINDS: dict[str, Kind] = {
    "nodes": Kind("v1", "Node", False),
    "pods": Kind("v1", "Pod", True),
    "poddisruptionbudgets": Kind("policy/v1", "PodDisruptionBudget", True),
    "gpunodes": Kind("gpufleet.io/v1alpha1", "GPUNode", False),
    "remediations": Kind("gpufleet.io/v1alpha1", "Remediation", False),
}

_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[a-z]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[a-z]+))?$"
)


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> Obj:
        body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                     "message": self.message, "reason": self.reason}
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeKubeAPI:
    """The store and the HTTP server. ``with FakeKubeAPI() as api: api.url``."""

    def __init__(self, *, bookmark_interval: float = 5.0, history: int = 10_000) -> None:
        self._lock = threading.Condition()
        self._objects: dict[tuple[str, str, str], Obj] = {}  # (plural, namespace, name) -> object
        self._rv = 1
        self._history: list[tuple[int, str, str, Obj]] = []  # (rv, plural, type, object)
        self._oldest = 1  # every change after this resourceVersion is in _history
        self._max_history = history
        self.bookmark_interval = bookmark_interval
        self._failures: list[tuple[int, str, str]] = []  # (code, reason, method filter)
        self._before_write: Callable[[], None] | None = None
        self._stopping = False
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request, in order
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-kube-api", daemon=True)

    # ---- lifecycle ----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeKubeAPI:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeKubeAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def stopped(self) -> bool:
        return self._stopping

    # ---- test controls ------------------------------------------------------------------------
    def fail_next(self, count: int, code: int = 503, reason: str = "ServiceUnavailable", method: str = "") -> None:
        """The next ``count`` requests (of ``method``, or any) are answered with ``code``."""
        with self._lock:
            self._failures.extend([(code, reason, method)] * count)

    def before_next_write(self, action: Callable[[], None]) -> None:
        """Run ``action`` (typically a write through :meth:`put`) just before the next write is applied:
        the write then races a change it did not read, as with a second controller."""
        self._before_write = action

    def compact(self) -> None:
        """Forget the change history: a watch resuming from an older resourceVersion gets 410."""
        with self._lock:
            self._history.clear()
            self._oldest = self._rv

    def get(self, plural: str, name: str, namespace: str = "") -> Obj | None:
        with self._lock:
            obj = self._objects.get((plural, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def put(self, plural: str, obj: Obj) -> Obj:
        """Create or replace an object directly (as another actor of the cluster would)."""
        with self._lock:
            meta = obj.setdefault("metadata", {})
            key = (plural, meta.get("namespace", "") if KINDS[plural].namespaced else "", meta["name"])
            kind = "MODIFIED" if key in self._objects else "ADDED"
            return self._store(plural, key, obj, kind)

    def delete(self, plural: str, name: str, namespace: str = "") -> None:
        with self._lock:
            self._delete(plural, (plural, namespace, name))

    def objects(self, plural: str) -> list[Obj]:
        with self._lock:
            return [copy.deepcopy(o) for (p, _, _), o in sorted(self._objects.items()) if p == plural]

    # ---- store ----------------------------------------------------------------------------------
    def _store(self, plural: str, key: tuple[str, str, str], obj: Obj, event: str) -> Obj:
        kind = KINDS[plural]
        self._rv += 1
        obj = copy.deepcopy(obj)
        obj["kind"], obj["apiVersion"] = kind.kind, kind.group_version
        meta = obj.setdefault("metadata", {})
        old = self._objects.get(key)
        meta.setdefault("uid", (old or {}).get("metadata", {}).get("uid") or str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", (old or {}).get("metadata", {}).get("creationTimestamp") or now_iso())
        meta["resourceVersion"] = str(self._rv)
        if kind.namespaced:
            meta["namespace"] = key[1]
        self._objects[key] = obj
        self._record(plural, event, obj)
        return copy.deepcopy(obj)

    def _delete(self, plural: str, key: tuple[str, str, str]) -> Obj:
        obj = self._objects.pop(key, None)
        if obj is None:
            raise ApiError(404, "NotFound", f'{plural} "{key[2]}" not found',
                           {"name": key[2], "kind": plural})
        self._rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._record(plural, "DELETED", obj)
        return obj

    def _record(self, plural: str, event: str, obj: Obj) -> None:
        self._history.append((self._rv, plural, event, copy.deepcopy(obj)))
        if len(self._history) > self._max_history:
            dropped = self._history.pop(0)
            self._oldest = dropped[0]
        self._lock.notify_all()

    # ---- operations (called by the handler with the lock NOT held) --------------------------------
    def take_failure(self, method: str) -> ApiError | None:
        with self._lock:
            for i, (code, reason, only) in enumerate(self._failures):
                if not only or only == method:
                    del self._failures[i]
                    return ApiError(code, reason, f"injected failure ({code} {reason})")
        return None

    def read(self, plural: str, ns: str, name: str) -> Obj:
        with self._lock:
            obj = self._objects.get((plural, ns, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found', {"name": name, "kind": plural})
            return copy.deepcopy(obj)

    def list(self, plural: str, ns: str | None, query: dict[str, str]) -> Obj:
        with self._lock:
            items = [copy.deepcopy(o) for (p, n, _), o in sorted(self._objects.items())
                     if p == plural and (ns is None or n == ns) and _selected(o, query)]
            for item in items:  # list items carry no kind/apiVersion of their own
                item.pop("kind", None)
                item.pop("apiVersion", None)
            kind = KINDS[plural]
            return {"kind": f"{kind.kind}List", "apiVersion": kind.group_version,
                    "metadata": {"resourceVersion": str(self._rv)}, "items": items}

    def create(self, plural: str, ns: str, body: Obj) -> Obj:
        name = body.get("metadata", {}).get("name")
        if not name:
            raise ApiError(422, "Invalid", f"{plural}: metadata.name: Required value")
        self._run_interference()
        with self._lock:
            key = (plural, ns, name)
            if key in self._objects:
                raise ApiError(409, "AlreadyExists", f'{plural} "{name}" already exists',
                               {"name": name, "kind": plural})
            body.setdefault("metadata", {}).pop("resourceVersion", None)
            return self._store(plural, key, body, "ADDED")

    def write(self, plural: str, ns: str, name: str, sub: str, body: Any, content_type: str, *,
              replace: bool) -> Obj:
        self._run_interference()
        with self._lock:
            key = (plural, ns, name)
            current = self._objects.get(key)
            if current is None:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found', {"name": name, "kind": plural})
            try:
                if replace:
                    new = body
                elif "json-patch" in content_type:
                    new = json_patch(current, body)
                elif "strategic-merge-patch" in content_type:
                    new = strategic_merge_patch(current, body)
                elif "merge-patch" in content_type:
                    new = merge_patch(current, body)
                else:
                    raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown "
                                   f"format - accepted media types include: application/json-patch+json, "
                                   f"application/merge-patch+json, application/apply-patch+yaml ({content_type})")
            except PatchError as err:
                raise ApiError(err.code, "Conflict" if err.code == 409 else "Invalid", str(err)) from None
            asked = (body.get("metadata") or {}).get("resourceVersion") if isinstance(body, dict) else None
            if asked and asked != current["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {plural} "{name}": the object '
                               "has been modified; please apply your changes to the latest version and try again",
                               {"name": name, "kind": plural})
            new = copy.deepcopy(new)
            if plural == "nodes" or KINDS[plural].group_version.startswith("gpufleet.io"):
                if sub == "status":  # the status subresource changes status only
                    new = {**copy.deepcopy(current), "status": new.get("status", {})}
                else:  # the main resource ignores status
                    new["status"] = copy.deepcopy(current.get("status", {}))
            new.setdefault("metadata", {})["name"] = name
            return self._store(plural, key, new, "MODIFIED")

    def remove(self, plural: str, ns: str, name: str) -> Obj:
        self._run_interference()
        with self._lock:
            return self._delete(plural, (plural, ns, name))

    def evict(self, ns: str, name: str) -> Obj:
        with self._lock:
            pod = self._objects.get(("pods", ns, name))
            if pod is None:
                raise ApiError(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
            budgets = [b for (p, n, _), b in self._objects.items()
                       if p == "poddisruptionbudgets" and n == ns and _matches(pod, b["spec"].get("selector"))]
            if len(budgets) > 1:
                raise ApiError(500, "InternalError", "This pod has more than one PodDisruptionBudget, which "
                               "the eviction subresource does not support.")
            if budgets:
                budget = budgets[0]
                pods = [o for (p, n, _), o in self._objects.items()
                        if p == "pods" and n == ns and _matches(o, budget["spec"].get("selector"))]
                healthy = sum(1 for o in pods if _ready(o))
                desired = _desired_healthy(budget["spec"], len(pods))
                if _ready(pod) and healthy - desired <= 0:
                    raise ApiError(429, "TooManyRequests",
                                   "Cannot evict pod as it would violate the pod's disruption budget.",
                                   {"causes": [{"reason": "DisruptionBudget", "message":
                                                f"The disruption budget {budget['metadata']['name']} needs "
                                                f"{desired} healthy pods and has {healthy} currently"}]})
            self._delete("pods", ("pods", ns, name))
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def watch(self, plural: str, ns: str | None, query: dict[str, str]) -> Iterator[Obj]:
        """Events as dicts, ending when the timeout passes or the server stops."""
        kind = KINDS[plural]
        timeout = float(query.get("timeoutSeconds") or 1800)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        with self._lock:
            asked = query.get("resourceVersion", "")
            if asked in ("", "0"):
                start = self._rv
                initial = [copy.deepcopy(o) for (p, n, _), o in sorted(self._objects.items())
                           if p == plural and (ns is None or n == ns) and _selected(o, query)]
            else:
                start, initial = int(asked), []
            deadline = _monotonic() + timeout
        for obj in initial:
            yield {"type": "ADDED", "object": obj}
        sent = start
        next_bookmark = _monotonic() + self.bookmark_interval
        while True:
            with self._lock:
                if sent < self._oldest:
                    yield {"type": "ERROR", "object": ApiError(
                        410, "Expired", f"too old resource version: {sent} ({self._rv})").status()}
                    return
                events = [e for e in self._history if e[0] > sent and e[1] == plural]
                now = _monotonic()
                if not events and not self._stopping and now < deadline:
                    self._lock.wait(timeout=max(0.0, min(deadline, next_bookmark) - now))
                    events = [e for e in self._history if e[0] > sent and e[1] == plural]
                stopping, head = self._stopping, self._rv
            for rv, _, etype, obj in events:
                sent = rv
                obj_ns = obj["metadata"].get("namespace", "")
                if (ns is None or obj_ns == ns) and _selected(obj, query):
                    yield {"type": etype, "object": obj}
            now = _monotonic()
            if stopping:
                return
            if bookmarks and (now >= next_bookmark or now >= deadline):
                sent = max(sent, head)
                yield {"type": "BOOKMARK", "object": {"kind": kind.kind, "apiVersion": kind.group_version,
                                                      "metadata": {"resourceVersion": str(sent)}}}
                next_bookmark = now + self.bookmark_interval
            if now >= deadline:
                return

    def _run_interference(self) -> None:
        action, self._before_write = self._before_write, None
        if action is not None:
            action()


def _monotonic() -> float:
    import time

    return time.monotonic()


def _ready(pod: Obj) -> bool:
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in pod.get("status", {}).get("conditions", []))


def _desired_healthy(spec: Obj, expected: int) -> int:
    if "minAvailable" in spec:
        return _scaled(spec["minAvailable"], expected, round_up=True)
    if "maxUnavailable" in spec:
        return max(0, expected - _scaled(spec["maxUnavailable"], expected, round_up=True))
    return expected  # an empty budget (no field set) allows no disruption


def _scaled(value: int | str, total: int, *, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        scaled = int(value[:-1]) * total
        return -(-scaled // 100) if round_up else scaled // 100
    return int(value)


def _matches(obj: Obj, selector: Obj | None) -> bool:
    if selector is None:
        return False  # policy/v1: a null selector selects no pods, an empty one ({}) selects every pod
    labels = obj.get("metadata", {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def _field(obj: Obj, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def _selected(obj: Obj, query: dict[str, str]) -> bool:
    for term in filter(None, query.get("fieldSelector", "").split(",")):
        key, negate, value = _split_term(term)
        if (_field(obj, key) == value) == negate:
            return False
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, query.get("labelSelector", "").split(",")):
        if "=" not in term:
            if (term.startswith("!") and term[1:] in labels) or (not term.startswith("!") and term not in labels):
                return False
            continue
        key, negate, value = _split_term(term)
        if (labels.get(key) == value) == negate:
            return False
    return True


def _split_term(term: str) -> tuple[str, bool, str]:
    if "!=" in term:
        key, value = term.split("!=", 1)
        return key.strip(), True, value.strip()
    key, value = term.split("==", 1) if "==" in term else term.split("=", 1)
    return key.strip(), False, value.strip()


def _handler(api: FakeKubeAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        def _serve(self, method: str) -> None:
            if api.stopped:  # a stopped server answers nothing (kept-alive connections included)
                self.close_connection = True
                return
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            api.requests.append((method, url.path))
            try:
                failure = api.take_failure(method)
                if failure is not None:
                    raise failure
                m = _PATH.match(url.path)
                if m is None or m["plural"] not in KINDS:
                    raise ApiError(404, "NotFound", f"the server could not find the requested resource ({url.path})")
                plural, ns, name, sub = m["plural"], m["ns"] or "", m["name"], m["sub"] or ""
                if method == "GET" and name is None and query.get("watch") in ("true", "1"):
                    self._stream(api.watch(plural, m["ns"], query))
                    return
                body = json.loads(raw) if raw else None
                if method == "GET":
                    out = api.read(plural, ns, name) if name else api.list(plural, m["ns"], query)
                    code = 200
                elif method == "POST" and sub == "eviction" and plural == "pods" and name:
                    out, code = api.evict(ns, name), 201
                elif method == "POST" and name is None:
                    out, code = api.create(plural, ns, body), 201
                elif method in ("PATCH", "PUT") and name:
                    out = api.write(plural, ns, name, sub, body, self.headers.get("Content-Type", ""),
                                    replace=method == "PUT")
                    code = 200
                elif method == "DELETE" and name:
                    out, code = api.remove(plural, ns, name), 200
                else:
                    raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {url.path}")
            except ApiError as err:
                out, code = err.status(), err.code
            except (ValueError, KeyError, TypeError) as err:
                out, code = ApiError(400, "BadRequest", f"bad request: {err}").status(), 400
            self._send(code, out)

        def _send(self, code: int, body: Obj) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, events: Iterator[Obj]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for event in events:
                    line = json.dumps(event).encode() + b"\n"
                    self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.close_connection = True

    return Handler
