"""Checkpoints to a local path or any fsspec URL (gs://, s3://, memory://), written atomically.

A checkpoint is one torch.save'd dict: model, EMA, optimizers, step, data position, carry, RNG, best-so-far.
It is written to `<name>.tmp-<pid>` and then moved over `<name>`, so a crash mid-write leaves the previous
checkpoint intact (a rename on local disks; on object stores a single-object PUT is atomic anyway).

The last two are kept: once the new `latest.pt` is fully written, the old one is moved to `previous.pt`
before the new one takes its place. `load_latest` (what a run resumes from) falls back to `previous.pt`, with
a warning naming both files, when `latest.pt` cannot be read (truncated, garbage, a failed read) or is missing
(a crash between the two moves); the caller still checks the identity of whichever it got.
"""

from __future__ import annotations

import io
import logging
import os
from typing import Any

import fsspec
import torch

LATEST = "latest.pt"
BEST = "best.pt"
PREVIOUS = "previous.pt"  # the latest.pt before the last save: what a run resumes from if latest.pt is unreadable
UNREADABLE_SUFFIX = ".unreadable"  # an unreadable latest.pt is kept aside under this name, never rotated
LOADED_FROM = "loaded_from"  # key load_latest adds to the state it returns: the file it was read from (not saved)

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    pass


class CheckpointUnreadableError(CheckpointError, ValueError):
    """A checkpoint's bytes are not a checkpoint (truncated, garbage) and there is none to fall back to: a retry
    would read the same bytes, so a ValueError, which a sweep does not retry. (A failed *read* is a plain
    CheckpointError: a retry may succeed.)"""


class CheckpointMismatchError(ValueError):
    """A checkpoint written by another run (other config, study or data): resuming it would record a result
    for training that never happened. A ValueError, so a sweep does not retry it."""


def check_url(url: str) -> None:
    """Refuse, before anything starts, a checkpoint URL whose fsspec filesystem is not installed here: `gs://`
    needs gcsfs (the `tpu` extra brings it), `s3://` s3fs. Otherwise the first checkpoint save would fail, after
    the start-up and the first eval interval had been paid for."""
    protocol, _ = fsspec.core.split_protocol(str(url))
    if protocol in (None, "file", "local"):
        return
    try:
        fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError) as err:
        raise ValueError(
            f"checkpoint.url={url!r}: fsspec cannot open {protocol}:// here ({err}); install its filesystem on every "
            "worker (gs://: `pip install gcsfs`, or trm-sweeps[tpu], which includes it) or use a local path"
        ) from None


IDENTITY = "identity"  # the checkpoint's key holding what wrote it: {"config": {...}, "data": fingerprint}


def check_identity(state: dict[str, Any], identity: dict[str, Any], where: str) -> None:
    """Refuse to resume `state` unless the run that wrote it trained exactly what this run trains."""
    fix = (
        "give this run its own out_dir / checkpoint.url, or set checkpoint.resume=false to start over "
        "(the checkpoint is then overwritten)"
    )
    where = state.get(LOADED_FROM) or where  # previous.pt when load_latest fell back to it
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


def _verify(fs: Any, path: str, written: memoryview) -> None:
    """Read `path` back and compare it with what was written, before it replaces anything: a disk or store that
    drops bytes without an error (a full quota, a lossy copy) is caught while the previous checkpoint is intact."""
    with fs.open(path, "rb") as f:
        back = f.read()
    if len(back) != written.nbytes or back != written.tobytes():  # bytes == bytes is a memcmp (a memoryview is not)
        raise OSError(f"read back {len(back)} bytes that differ from the {len(written)} written")


def encode(state: dict[str, Any]) -> memoryview:
    """`state` as the bytes a checkpoint file holds (torch.save). Done on the training thread: the state's tensors
    are the live weights (state_dict shares their storage), so once encoded, training may change them."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getbuffer()


def save(url: str, name: str, state: dict[str, Any]) -> str:
    """Write `state` to `<url>/<name>` atomically and verified (read back); return the full path. Saving
    `latest.pt` first moves the one it replaces to `previous.pt` (only once the new one is written and verified)."""
    return put(url, name, encode(state))


def put(url: str, name: str, data: memoryview) -> str:
    """Write the checkpoint bytes `data` (`encode`) to `<url>/<name>` as `save` does: `<name>.tmp-<pid>`, read back,
    `latest.pt` rotated to `previous.pt`, then renamed over `<name>`. A crash at any point leaves a complete
    `<name>` (or, between the two moves, a complete `previous.pt`) that `load_latest` resumes; a leftover tmp file
    is never read. CheckpointError naming the file if it could not be written."""
    fs, root = fsspec.core.url_to_fs(url)
    target = _join(root, name)
    tmp = f"{target}.tmp-{os.getpid()}"
    try:
        fs.makedirs(root, exist_ok=True)
        with fs.open(tmp, "wb") as f:
            f.write(data)
        _verify(fs, tmp, data)
        if name == LATEST and fs.exists(target):
            fs.mv(target, _join(root, PREVIOUS))  # replaces the older previous.pt (a rename on local disks)
        fs.mv(tmp, target)
    except OSError as err:
        try:
            if fs.isfile(tmp):
                fs.rm(tmp)
        except Exception:  # noqa: BLE001 (best-effort cleanup; the error that matters is the write's)
            pass
        raise CheckpointError(f"could not write checkpoint {_join(url, name)}: {err}") from err
    return _join(url, name)


def is_remote(url: str) -> bool:
    """Whether `url` names a remote store (gs://, s3://, memory://): any fsspec protocol but a local path's."""
    protocol, _ = fsspec.core.split_protocol(str(url))
    return protocol not in (None, "file", "local")


def move_aside(url: str, name: str) -> str:
    """Move an unreadable `<url>/<name>` to `<name>.unreadable` (kept for a look, never rotated or resumed);
    return a clause for the message that names it: where it went, or why it could not be moved."""
    fs, root = fsspec.core.url_to_fs(url)
    try:
        fs.mv(_join(root, name), _join(root, name + UNREADABLE_SUFFIX))
        return f"; it was moved to {_join(url, name + UNREADABLE_SUFFIX)}"
    except OSError as err:
        return f"; it could not be moved aside ({err})"


def _read(fs: Any, path: str) -> bytes | None:
    """The file's bytes; None if it does not exist. OSError if it cannot be read."""
    if not fs.exists(path):
        return None
    with fs.open(path, "rb") as f:
        return f.read()


def _decode(data: bytes) -> dict[str, Any]:
    """The checkpoint in `data`; ValueError naming what is wrong if it is not one (truncated, garbage)."""
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    except Exception as err:  # torch raises RuntimeError, UnpicklingError, EOFError, ... on bad bytes
        raise ValueError(f"{len(data)} bytes that torch cannot load, {type(err).__name__}: {err}") from err
    if not isinstance(state, dict) or "step" not in state:
        raise ValueError(f"it holds a {type(state).__name__} without a 'step', not a checkpoint")
    return state


def load(url: str, name: str = LATEST) -> dict[str, Any] | None:
    """The checkpoint at `<url>/<name>`, or None if there is none; CheckpointUnreadableError naming the file if
    it cannot be read."""
    fs, root = fsspec.core.url_to_fs(url)
    try:
        data = _read(fs, _join(root, name))
        return None if data is None else _decode(data)
    except (OSError, ValueError) as err:
        raise CheckpointUnreadableError(f"checkpoint {_join(url, name)} cannot be read: {err}") from err


def load_latest(url: str) -> dict[str, Any] | None:
    """What a run resumes from: `latest.pt`, else `previous.pt` (logged as a warning naming both), else None.

    `previous.pt` is used when `latest.pt` is missing or cannot be read; an unreadable `latest.pt` whose bytes
    were read (truncated, garbage) is moved to `latest.pt.unreadable`, so that the next save does not rotate it
    over the good `previous.pt`. The returned state carries `LOADED_FROM`, the file it came from (check_identity
    names it). If neither can be read, an error naming both files and why: CheckpointUnreadableError when their
    bytes are bad, CheckpointError (worth a retry) when a read failed."""
    fs, root = fsspec.core.url_to_fs(url)
    latest, previous = _join(root, LATEST), _join(root, PREVIOUS)
    problem, corrupt = None, False
    state: dict[str, Any] | None
    try:
        data = _read(fs, latest)
        if data is not None:
            state = _decode(data)
            state[LOADED_FROM] = _join(url, LATEST)
            return state
    except OSError as err:  # the read failed: the file may be fine, so it stays where it is
        problem = f"{type(err).__name__}: {err}"
    except ValueError as err:
        problem, corrupt = str(err), True
    fix = "delete {}, or set checkpoint.resume=false to start over"
    try:
        data = _read(fs, previous)
        state = None if data is None else _decode(data)
    except (OSError, ValueError) as err:
        kind = (
            CheckpointUnreadableError
            if isinstance(err, ValueError) and (corrupt or problem is None)
            else CheckpointError
        )
        if problem is None:  # no latest.pt (a crash between the two moves of a save) and a bad previous.pt
            raise kind(
                f"checkpoint {_join(url, PREVIOUS)} cannot be read ({err}) and there is no "
                f"{_join(url, LATEST)}: {fix.format('it')}"
            ) from err
        raise kind(
            f"checkpoint {_join(url, LATEST)} cannot be read ({problem}), nor can {_join(url, PREVIOUS)} "
            f"({err}): {fix.format('them')}"
        ) from err
    if state is None:
        if problem is None:
            return None  # a fresh run
        kind = CheckpointUnreadableError if corrupt else CheckpointError
        raise kind(
            f"checkpoint {_join(url, LATEST)} cannot be read ({problem}) and there is no {_join(url, PREVIOUS)} "
            f"to fall back to: {fix.format('it')}"
        )
    aside = move_aside(url, LATEST) if corrupt else ""
    why = f"cannot be read ({problem}){aside}" if problem is not None else "is missing (a save was interrupted)"
    log.warning(
        "checkpoint %s %s. Resuming from %s (step %s) instead: the steps since then are trained again",
        _join(url, LATEST),
        why,
        _join(url, PREVIOUS),
        state.get("step"),
    )
    state[LOADED_FROM] = _join(url, PREVIOUS)
    return state
