"""Read a W&B run's ``.wandb`` file (what ``wandb sync`` uploads): the SDK writes it from Go and ships no
Python reader, so this is the file format — a 7-byte header (``:W&B``, 0xBEE1, version 0), then LevelDB
log blocks of 32 KiB holding length-prefixed chunks (CRC-32C, length, type full/first/middle/last) of
``wandb_internal_pb2.Record`` protobufs."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:7] == HEADER, f"{path}: not a .wandb file ({data[:7]!r})"
    out, pos, part = [], 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # the block's tail is padding
            pos += left
            continue
        length, kind = struct.unpack_from("<HB", data, pos + 4)
        if length == 0 and kind == 0:
            break
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        part = chunk if kind in (FULL, FIRST) else part + chunk
        if kind in (FULL, LAST):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(part)
            out.append(rec)
    return out


def history(path: Path) -> list[dict[str, Any]]:
    """The rows ``wandb.log`` wrote, keys joined with / (values decoded from JSON)."""
    rows = []
    for r in records(path):
        if r.WhichOneof("record_type") == "history":
            rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item})
    return rows


def summary(path: Path) -> dict[str, Any]:
    """The summary as the last ``summary`` record left it (updates applied in order)."""
    out: dict[str, Any] = {}
    for r in records(path):
        if r.WhichOneof("record_type") == "summary":
            for i in r.summary.update:
                out[i.key or "/".join(i.nested_key)] = json.loads(i.value_json)
    return out
