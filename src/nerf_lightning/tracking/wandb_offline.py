"""Read an offline W&B run back (config, history, summary) without the W&B server."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["read_offline_run"]

_BLOCK = 32 * 1024
_HEADER = 7  # ":W&B" + magic 0xBEE1 (LE) + version; records: crc32 (4) + length (2, LE) + type (1)
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _iter_record_bytes(path: Path) -> Iterator[bytes]:
    """Payloads of a ``.wandb`` file (LevelDB log format: 32 KiB blocks, records split across them)."""
    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a W&B transaction log (bad header {data[:4]!r})")
    pos, pending = _HEADER, b""
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # block trailer padding
            pos += left
            continue
        length, kind = struct.unpack_from("<HB", data, pos + 4)
        if kind == 0 and length == 0:
            pos += left  # zero padding to the next block
            continue
        payload = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == _FULL:
            yield payload
        elif kind == _FIRST:
            pending = payload
        elif kind == _MIDDLE:
            pending += payload
        elif kind == _LAST:
            yield pending + payload
            pending = b""


def read_offline_run(run_dir: str | Path) -> dict[str, Any]:
    """Read back an offline W&B run folder (``.../wandb/offline-run-*``).

    Returns:
        ``{"config": {key: value}, "history": [{key: value, ...} per wandb.log], "summary": {key: value},
        "group": str, "tags": [str], "name": str}``; values decoded from JSON.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    run_dir = Path(run_dir)
    files = sorted(run_dir.glob("*.wandb"))
    if not files:
        raise FileNotFoundError(f"no .wandb file in {run_dir}")
    out: dict[str, Any] = {"config": {}, "history": [], "summary": {}, "group": "", "tags": [], "name": ""}
    for payload in _iter_record_bytes(files[0]):
        rec = pb.Record()
        rec.ParseFromString(payload)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            # A run can be recorded again later (updates) with fields left empty: keep what was set.
            out["group"] = rec.run.run_group or out["group"]
            out["name"] = rec.run.display_name or out["name"]
            out["tags"] = list(rec.run.tags) or out["tags"]
            for item in rec.run.config.update:
                out["config"][item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "config":
            for item in rec.config.update:
                out["config"][item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "history":
            row = {}
            for item in rec.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            out["history"].append(row)
        elif kind == "summary":
            for item in rec.summary.update:
                key = item.key or "/".join(item.nested_key)
                out["summary"][key] = json.loads(item.value_json)
    # Offline runs may carry no summary record: the last logged value of each key is W&B's summary.
    last: dict[str, Any] = {}
    for row in out["history"]:
        last.update(row)
    out["summary"] = {**last, **out["summary"]}
    return out
