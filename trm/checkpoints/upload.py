"""Checkpoints off the training path: rank 0 writes each checkpoint to a local staging directory and a background
thread uploads it to a remote `checkpoint.url` (gs://), so a save blocks training for the gather, the encoding and
a local write, not for the upload.

Which saves are staged (`checkpoint.staging`): `auto` stages for a remote URL (any fsspec protocol but a local
path's) and writes a local checkpoint.url directly, as before; `always` stages for a local one too (a slow network
mount; the tests); `never` always writes checkpoint.url directly.

The upload is the direct write's own code (trm/checkpoints/checkpoint.py `put`), so it keeps its guarantees: each file
goes to `<name>.tmp-<pid>` at checkpoint.url, is read back, and only then renamed over `<name>` (`latest.pt` first
rotated to `previous.pt`: the two kept checkpoints). A resume reads only those names (trm/checkpoints/checkpoint.py
`load_latest`), so an upload cut short (a killed job, a failed write) leaves at most a tmp file, never read, beside the
last complete checkpoint.

Invariants:
- At most one upload in flight (`Uploads.start` refuses a second). A save waits for the one in flight before it
  stages the next (trm/checkpointer.py): uploads land in the order of their steps, so an older checkpoint never
  overwrites a newer one.
- A stop (the end, a preemption, an error) waits for the upload in flight up to `checkpoint.upload_wait_s`.
- An upload that failed, or is still running when a bounded wait ends, is reported once, as a failed direct write
  is: trm/checkpointer.py raises it as a CheckpointError on every rank (a sweep retries it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, Protocol

from trm.checkpoints import checkpoint

STAGED = "staged.pt"  # the one staged file under checkpoint.local_dir: the checkpoint the upload in flight copies


class CheckpointSettings(Protocol):
    """The `checkpoint` block of the training config (contracts/train_config.py CheckpointConfig) a save reads."""

    url: str
    staging: Literal["auto", "always", "never"]
    local_dir: str
    upload_wait_s: float


def staged(settings: CheckpointSettings) -> bool:
    """Whether saves go through the local staging directory and a background upload (`checkpoint.staging`)."""
    return settings.staging == "always" or (settings.staging == "auto" and checkpoint.is_remote(settings.url))


class Uploads:
    """Rank 0's upload in flight, at most one, on a daemon thread (a process that exits without waiting, as a
    killed one does, leaves the last complete checkpoint at checkpoint.url)."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._what = ""  # "step N to <url>": what the upload in flight (or the last one) copies
        self._error: str | None = None  # why the last upload failed; cleared once reported
        self._late = False  # the upload in flight outlasted a bounded wait (reported): no later wait waits again
        self.last_s: float | None = None  # seconds the last upload that landed took: what the next one may take

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, url: str, step: int, source: Path, names: Sequence[str]) -> None:
        """Copy the staged checkpoint `source` (of `step`) to `<url>/<name>` for each of `names`, in the background.
        The caller waits for the upload in flight first (`wait`): `source` is not rewritten while it is read."""
        if self.in_flight:
            raise RuntimeError(f"an upload ({self._what}) is in flight: wait for it before starting another")
        self._late = False
        self._what = f"step {step} to {url.rstrip('/')}/{'+'.join(names)}"
        self._thread = threading.Thread(
            target=self._copy, args=(url, source, tuple(names)), name="checkpoint-upload", daemon=True
        )
        self._thread.start()

    def _copy(self, url: str, source: Path, names: tuple[str, ...]) -> None:
        try:
            start = time.monotonic()
            data = memoryview(source.read_bytes())
            for name in names:  # latest.pt first: best.pt of the same step never lands without it
                checkpoint.put(url, name, data)
            self.last_s = time.monotonic() - start
        except Exception as err:  # noqa: BLE001 (a store's client raises its own kinds; each is reported, none lost)
            self._error = f"could not upload checkpoint {self._what}: {type(err).__name__}: {err}"

    def wait(self, timeout_s: float | None) -> str | None:
        """Wait for the upload in flight, at most `timeout_s` seconds (None: until it ends); then the failure to
        report, once: why the last upload failed, or that it is still running. None: everything started landed."""
        if self._thread is not None:
            if self._late:
                return None  # reported already: a stop after a failed stop does not wait the grace twice
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                self._late = True
                return (
                    f"the checkpoint upload of {self._what} was still running after checkpoint.upload_wait_s="
                    f"{timeout_s:g} s; the last complete checkpoint there is kept. Raise checkpoint.upload_wait_s "
                    "(within the launcher's kill_grace_s), or check the store's speed"
                )
            self._thread = None
        error, self._error = self._error, None
        return error
