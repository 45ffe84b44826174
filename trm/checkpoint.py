"""Checkpoints to a local path or any fsspec URL (gs://, s3://, memory://), written atomically.

A checkpoint is one torch.save'd dict: model, EMA, optimizers, step, data position, carry, RNG, best-so-far.
It is written to `<name>.tmp-<pid>` and then moved over `<name>`, so a crash mid-write leaves the previous
checkpoint intact (a rename on local disks; on object stores a single-object PUT is atomic anyway).
"""
from __future__ import annotations

import io
import os
from typing import Any

import fsspec
import torch

LATEST = "latest.pt"
BEST = "best.pt"


class CheckpointError(RuntimeError):
    pass


class CheckpointMismatchError(ValueError):
    """A checkpoint written by another run (other config, study or data): resuming it would record a result
    for training that never happened. A ValueError, so a sweep does not retry it."""


IDENTITY = "identity"  # the checkpoint's key holding what wrote it: {"config": {...}, "data": fingerprint}


def check_identity(state: dict[str, Any], identity: dict[str, Any], where: str) -> None:
    """Refuse to resume `state` unless the run that wrote it trained exactly what this run trains."""
    fix = (
        "give this run its own out_dir / checkpoint.url, or set checkpoint.resume=false to start over "
        "(the checkpoint is then overwritten)"
    )
    stored = state.get(IDENTITY)
    if not isinstance(stored, dict):
        raise CheckpointMismatchError(f"{where} carries no identity of the run that wrote it (an older version): {fix}")
    differences = []
    if stored.get("data") != identity["data"]:
        differences.append("the dataset (fingerprint)")
    theirs, ours = stored.get("config", {}), identity["config"]
    for key in sorted(set(theirs) | set(ours)):
        if theirs.get(key, "<absent>") != ours.get(key, "<absent>"):
            differences.append(f"{key}: {theirs.get(key, '<absent>')!r} there, {ours.get(key, '<absent>')!r} here")
    if differences:
        shown = "; ".join(differences[:6]) + (f"; and {len(differences) - 6} more" if len(differences) > 6 else "")
        raise CheckpointMismatchError(f"{where} was written by another run ({shown}): refusing to resume it; {fix}")


def _join(url: str, name: str) -> str:
    return url.rstrip("/") + "/" + name


def save(url: str, name: str, state: dict[str, Any]) -> str:
    """Write `state` to `<url>/<name>` atomically; return the full path."""
    fs, root = fsspec.core.url_to_fs(url)
    target = _join(root, name)
    tmp = f"{target}.tmp-{os.getpid()}"
    buffer = io.BytesIO()
    torch.save(state, buffer)
    try:
        fs.makedirs(root, exist_ok=True)
        with fs.open(tmp, "wb") as f:
            f.write(buffer.getbuffer())
        fs.mv(tmp, target)
    except OSError as err:
        try:
            if fs.isfile(tmp):
                fs.rm(tmp)
        except Exception:  # best-effort cleanup; the error that matters is the write's
            pass
        raise CheckpointError(f"could not write checkpoint {_join(url, name)}: {err}") from err
    return _join(url, name)


def load(url: str, name: str = LATEST) -> dict[str, Any] | None:
    """The checkpoint at `<url>/<name>`, or None if there is none."""
    fs, root = fsspec.core.url_to_fs(url)
    path = _join(root, name)
    if not fs.exists(path):
        return None
    with fs.open(path, "rb") as f:
        return torch.load(io.BytesIO(f.read()), map_location="cpu", weights_only=False)
