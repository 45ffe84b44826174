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
