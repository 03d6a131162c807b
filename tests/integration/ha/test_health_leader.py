"""``GET /v1/health`` of a real ``controller serve`` on PostgreSQL names a leader only while one leads (a
drill: with the database gone and the lease run out, the replica said ``role: follower`` and named
itself as ``leader_url``; a follower kept naming a leader whose lease had long expired)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.integration.pglab import pg_lab
from tests.integration.serve.serving import HEADERS, serving

pytestmark = [pytest.mark.ha, pytest.mark.postgres]


def _health(base: str) -> dict[str, object]:
    r = httpx.get(f"{base}/health", headers=HEADERS, timeout=5)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_health_names_no_leader_once_the_lease_has_run_out(tmp_path: Path) -> None:
    with pg_lab() as db, serving(tmp_path, db.url, "[ha]\nlease_s = 2\nrenew_s = 0.5\n") as base:
        deadline = time.monotonic() + 30
        # the lease names where its holder serves from the first renewal after the port is bound
        while (h := _health(base))["leader_url"] is None:
            assert time.monotonic() < deadline, f"no leader named within 30 s: {h}"
            time.sleep(0.1)  # polling for the first renewal, not timing it
        assert h["role"] == "leader" and h["leader_url"] == base.removesuffix("/v1"), h
        db.down()  # the lease can no longer be renewed: it runs out lease_s after the last renewal
        deadline = time.monotonic() + 30
        while (h := _health(base))["role"] == "leader":
            assert time.monotonic() < deadline, f"still leading 30 s after the database went away: {h}"
            time.sleep(0.1)  # polling until the lease runs out, not timing it
        assert h["leader_url"] is None, f"nobody leads, yet /v1/health names a leader: {h}"
        db.up()  # back: the replica takes the lease again with the next epoch and names itself
        deadline = time.monotonic() + 60
        while (h := _health(base))["role"] != "leader":
            assert time.monotonic() < deadline, f"did not lead again within 60 s of the database's return: {h}"
            time.sleep(0.1)
        assert h["leader_url"] == base.removesuffix("/v1") and int(str(h["epoch"])) == 2, h
