"""The API under test: the real FastAPI app on a real SQLite store, a SimScheduler and its reconciler."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy import Engine, event, func, make_url, select

from gpufleet.controller.api.app import create_app
from gpufleet.controller.clock import ManualClock
from gpufleet.controller.maintenance import Maintenance
from gpufleet.controller.reconciler import Reconciler
from gpufleet.controller.service import Controller
from gpufleet.controller.settings import Role, TenancySettings, TokenConfig
from gpufleet.controller.store.db import make_engine, migrate
from gpufleet.controller.store.models import ActionRow, AuditRow, DecisionRow, EventRow, TransitionRow
from gpufleet.controller.store.repo import Store
from gpufleet.controller.tenancy import Tenancy
from gpufleet.domain.tenancy import Tenant
from gpufleet.lifecycle.config import load_policy
from gpufleet.schedulers.sim import SimScheduler
from tests.conftest import require_service
from tests.integration.store.backends import WHAT, Postgres

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette's note about httpx2 in its test client
    from fastapi.testclient import TestClient

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)

TOKENS = {
    "viewer": TokenConfig(name="vera", role=Role.VIEWER, token="viewer-token-00000001"),
    "agent": TokenConfig(name="agent-all", role=Role.AGENT, token="agent-token-000000001", nodes=("*",)),
    "agent-r01": TokenConfig(name="agent-r01", role=Role.AGENT, token="agent-r01-token-00001", nodes=("r01-*",)),
    "operator": TokenConfig(name="alice", role=Role.OPERATOR, token="operator-token-000001"),
    "admin": TokenConfig(name="root", role=Role.ADMIN, token="admin-token-000000001"),
    # tenant-scoped (docs/tenancy.md): acme owns rack r01, globex rack r02 (TENANTS)
    "acme-viewer": TokenConfig(name="acme-v", role=Role.VIEWER, token="acme-viewer-token-001", tenant="acme"),
    "acme-operator": TokenConfig(name="acme-op", role=Role.OPERATOR, token="acme-operator-token01", tenant="acme"),
}
TENANTS = (Tenant("acme", ("r01-*",), 0x0A01), Tenant("globex", ("r02-*",), 0x0A02))
ROLES = ("viewer", "agent", "operator", "admin")


def auth(who: str) -> dict[str, str]:
    token = TOKENS[who].token
    assert token is not None
    return {"Authorization": f"Bearer {token}"}


def node_ids(nodes: int, racks: int) -> list[str]:
    """``nodes`` node names spread evenly over ``racks`` racks: r01-n01, r01-n02, ..., r02-n01, ..."""
    per = nodes // racks
    return [f"r{r:02d}-n{i:02d}" for r in range(1, racks + 1) for i in range(1, per + 1)]


@dataclass
class Api:
    app: FastAPI
    client: TestClient
    controller: Controller
    reconciler: Reconciler
    scheduler: SimScheduler
    clock: ManualClock
    engine: Engine
    nodes: list[str]

    def tick(self, by: timedelta = timedelta(seconds=1)) -> datetime:
        return self.clock.advance(by)

    def post(self, path: str, body: Any = None, who: str = "admin") -> Any:
        return self.client.post(path, json=body, headers=auth(who))

    def get(self, path: str, who: str = "viewer", **params: Any) -> Any:
        r = self.client.get(path, headers=auth(who), params=params)
        assert r.status_code == 200, r.text
        return r.json()

    def event(self, eid: str, node: str, kind: str = "xid", code: int | None = 79, **extra: Any) -> dict[str, Any]:
        doc: dict[str, Any] = {"id": eid, "node": node, "kind": kind, "time": self.clock.now().isoformat()}
        if code is not None:
            doc["code"] = code
        return doc | extra

    def rows(self) -> dict[str, int]:
        """Row counts straight from the database."""
        with self.engine.connect() as conn:
            return {m.__tablename__: int(conn.execute(select(func.count()).select_from(m)).scalar_one())
                    for m in (EventRow, DecisionRow, TransitionRow, ActionRow, AuditRow)}

    def states(self) -> dict[str, str]:
        return {n["id"]: n["state"] for n in self.get("/v1/nodes", limit=1000)}


def make_api(tmp_path: Path, nodes: int = 8, racks: int = 2, *, fast_ingest: bool = True,
             database_url: str | None = None) -> Api:
    engine = make_engine(database_url or f"sqlite:///{tmp_path / 'api.db'}")
    migrate(engine)
    clock = ManualClock(T0)
    controller = Controller(Store(engine), load_policy(), clock)
    names = node_ids(nodes, racks)
    scheduler = SimScheduler(names)
    maintenance = Maintenance(controller, scheduler)
    tenancy = Tenancy(maintenance, TENANTS, TenancySettings(wipe="script:reimage"))
    reconciler = Reconciler(controller, scheduler, maintenance=maintenance, tenancy=tenancy)
    app = create_app(controller, tuple(TOKENS.values()), reconciler, fast_ingest=fast_ingest)
    client = TestClient(app)
    api = Api(app, client, controller, reconciler, scheduler, clock, engine, names)
    body = {"state": "ready", "nodes": [{"id": n, "rack": n.split("-")[0]} for n in names]}
    r = api.post("/v1/nodes", body)
    assert r.status_code == 201, r.text
    assert r.json() == {"registered": len(names), "already_known": 0}
    api.tick()
    return api


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    a = make_api(tmp_path)
    yield a
    a.client.close()
    a.engine.dispose()


# ---- the same API on either database --------------------------------------------------------------------
BACKENDS = [pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres", marks=pytest.mark.postgres)]


@contextmanager
def api_on(backend: str, tmp_path: Path, *, lock_wait_ms: int | None = None) -> Iterator[Api]:
    """:func:`make_api` on a SQLite file or on a throwaway schema of the real PostgreSQL
    (``GPUFLEET_TEST_POSTGRES_URL``; skipped locally, failed in CI, without it).

    ``lock_wait_ms``: how long a statement waits for a lock another connection holds before the
    database refuses it (SQLite's ``busy_timeout``, PostgreSQL's ``lock_timeout``) — the controller's
    own 30 s SQLite wait, and none on PostgreSQL, would hold a test that much longer.
    """
    if backend == "sqlite":
        api = make_api(tmp_path)
        if lock_wait_ms is not None:
            def _busy(dbapi_conn: Any, _record: Any) -> None:
                dbapi_conn.execute(f"PRAGMA busy_timeout={int(lock_wait_ms)}")

            event.listen(api.engine, "connect", _busy)  # after the engine's own pragmas, so it wins
            api.engine.dispose()  # pooled connections reconnect with it
        try:
            yield api
        finally:
            api.client.close()
            api.engine.dispose()
        return
    pg = Postgres.from_env()
    require_service(pg is not None, WHAT)
    assert pg is not None
    try:
        with pg.database(migrated=True) as schema_url:
            url = schema_url
            if lock_wait_ms is not None:
                u = make_url(schema_url)
                options = f"{u.query.get('options', '')} -clock_timeout={int(lock_wait_ms)}".strip()
                url = u.update_query_dict({"options": options}).render_as_string(hide_password=False)
            api = make_api(tmp_path, database_url=url)
            try:
                yield api
            finally:
                api.client.close()
                api.engine.dispose()
    finally:
        pg.close()


@pytest.fixture(params=BACKENDS)
def db_api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Api]:
    """The API on SQLite and on the real PostgreSQL (see :func:`api_on`)."""
    with api_on(request.param, tmp_path) as api:
        yield api
