"""Diagnostic bundles, stored with the repair record (table ``bundles``, migration 0006; docs/bmc.md).

A bundle is one JSON document (``gpufleet.bundle/v1``) kept gzip-compressed in the database, so it lives
and is backed up with the repair log it belongs to and needs no shared file system between controller
replicas. Bounded: :data:`MAX_BUNDLE_BYTES` compressed (the agent trims what it sends to fit); a larger
upload is refused. Keyed by the capture command's key: a re-sent upload replaces nothing.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select

from gpufleet.domain.errors import InvalidInput, NotFound

from .models import BundleRow
from .repo import Store

FORMAT = "gpufleet.bundle/v1"
MAX_BUNDLE_BYTES = 16 * 1024 * 1024  # compressed


@dataclass(frozen=True, slots=True)
class BundleInfo:
    id: str
    node: str
    action_id: str
    created: datetime
    size: int
    sha256: str
    summary: str


def _info(r: BundleRow) -> BundleInfo:
    return BundleInfo(r.id, r.node, r.action_id, r.created, r.size, r.sha256, r.summary)


class BundleStore:
    def __init__(self, store: Store) -> None:
        self.session = store.session

    def put(self, bundle_id: str, node: str, action_id: str, doc: dict[str, Any], now: datetime,
            summary: str) -> BundleInfo:
        """Store ``doc`` under ``bundle_id`` (the first copy stays: idempotent)."""
        data = gzip.compress(json.dumps(doc, sort_keys=True, default=str).encode(), mtime=0)
        if len(data) > MAX_BUNDLE_BYTES:
            raise InvalidInput("bundle", f"{len(data)} bytes compressed", f"at most {MAX_BUNDLE_BYTES} bytes")
        with self.session.begin() as s:
            r = s.get(BundleRow, bundle_id)
            if r is None:
                r = BundleRow(id=bundle_id, node=node, action_id=action_id, created=now, size=len(data),
                              sha256=hashlib.sha256(data).hexdigest(), summary=summary[:2000], data=data)
                s.add(r)
                s.flush()
            return _info(r)

    def info(self, bundle_id: str) -> BundleInfo | None:
        with self.session() as s:
            r = s.get(BundleRow, bundle_id)
            return None if r is None else _info(r)

    def data(self, bundle_id: str) -> bytes:
        """The gzip of the bundle's JSON."""
        with self.session() as s:
            r = s.get(BundleRow, bundle_id)
            if r is None:
                raise NotFound("bundle", bundle_id)
            return bytes(r.data)

    def of_node(self, node: str) -> list[BundleInfo]:
        q = select(BundleRow).where(BundleRow.node == node).order_by(BundleRow.created.desc())
        with self.session() as s:
            return [_info(r) for r in s.scalars(q)]
