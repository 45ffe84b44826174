"""Read a W&B offline run back without W&B's servers: the tests check what rank 0 logged.

wandb 0.31 writes no config.yaml / wandb-summary.json offline and has no public reader of its `.wandb` log,
so this parses the log format itself (LevelDB-style records of wandb.proto Records, checksums verified).
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# ------------------------------------------------------------------------------- reading offline runs

# The .wandb file: a 7-byte header (":W&B", magic 0xBEE1, version) then LevelDB-log records in 32 KiB blocks:
# each record is crc32 (seeded with the record type), length, type (1 full, 2 first, 3 middle, 4 last), and a
# serialized wandb.proto Record.
_BLOCK, _HEADER = 32768, 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
_TYPE_CRC = {t: zlib.crc32(bytes([t])) for t in (_FULL, _FIRST, _MIDDLE, _LAST)}


def iter_records(path: str | os.PathLike[str]) -> Iterator[Any]:
    """Every protobuf Record in a `.wandb` file, checksums verified."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    ident, magic, _version = struct.unpack_from("<4sHB", data, 0)
    if ident != b":W&B" or magic != 0xBEE1:
        raise ValueError(f"{path}: not a W&B run log (header {ident!r}, magic {magic:#x})")
    pos, pending = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # block trailer padding
            pos += left
            continue
        crc, length, kind = struct.unpack_from("<IHB", data, pos)
        if kind == 0 and length == 0:  # zero padding up to the end of the block
            pos += left
            continue
        payload = data[pos + _HEADER : pos + _HEADER + length]
        if kind not in _TYPE_CRC or zlib.crc32(payload, _TYPE_CRC[kind]) & 0xFFFFFFFF != crc:
            raise ValueError(f"{path}: corrupt record at byte {pos}")
        pos += _HEADER + length
        if kind == _FULL:
            yield pb.Record.FromString(payload)
        elif kind == _FIRST:
            pending = payload
        elif kind == _MIDDLE:
            pending += payload
        else:
            yield pb.Record.FromString(pending + payload)
            pending = b""


@dataclass
class OfflineRun:
    path: Path
    run_id: str = ""
    project: str = ""
    group: str = ""
    name: str = ""
    job_type: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)  # one row per step: {"_step": s, key: value}
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None

    def series(self, key: str) -> dict[int, float]:
        """{step: value} of one logged metric."""
        return {int(row["_step"]): row[key] for row in self.history if key in row}


def _set(target: dict[str, Any], item: Any, value: Any) -> None:
    """Store under the item's key; a nested key (["trials", "path"]) becomes nested dicts."""
    keys = list(item.nested_key) or [item.key]
    for key in keys[:-1]:
        target = target.setdefault(key, {})
    target[keys[-1]] = value


def _pop(target: dict[str, Any], item: Any) -> None:
    keys = list(item.nested_key) or [item.key]
    for key in keys[:-1]:
        target = target.get(key) or {}
    target.pop(keys[-1], None)


def _update(target: dict[str, Any], items: Any) -> dict[str, Any]:
    for item in items:
        _set(target, item, json.loads(item.value_json))
    return target


def read_offline_run(path: str | os.PathLike[str]) -> OfflineRun:
    """An offline run read back from its directory (or `.wandb` file): identity, config, history, summary."""
    path = Path(path)
    log_file = path if path.suffix == ".wandb" else next(iter(sorted(path.glob("*.wandb"))), None)
    if log_file is None:
        raise FileNotFoundError(f"no .wandb file in {path}")
    run = OfflineRun(path=path)
    for record in iter_records(log_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            run.run_id, run.project, run.group, run.name, run.job_type = (
                r.run_id,
                r.project,
                r.run_group,
                r.display_name,
                r.job_type,
            )
            run.tags = list(r.tags)
            _update(run.config, r.config.update)
        elif kind == "config":
            _update(run.config, record.config.update)
            for item in record.config.remove:
                _pop(run.config, item)
        elif kind == "history":
            run.history.append(_update({}, record.history.item))
        elif kind == "summary":
            _update(run.summary, record.summary.update)
            for item in record.summary.remove:
                _pop(run.summary, item)
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    run.config.pop("_wandb", None)
    return run


def find_runs(root: str | os.PathLike[str]) -> list[Path]:
    """Run directories (offline or synced) under `root`, oldest first."""
    return sorted({p.parent for p in Path(root).rglob("*.wandb")}, key=lambda p: (p.stat().st_mtime, str(p)))
