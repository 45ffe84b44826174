"""Preemption: SIGTERM (a preemption notice, a scheduler) sets a flag the training loop checks every few steps
(`train.preemption_check_interval`), so every rank stops at the same step with a checkpoint instead of dying
mid-write. The flag keeps when the first SIGTERM came (wall-clock time, comparable across VMs): the stop's save
and upload must end within the kill grace counted from it (`checkpoint.stop_grace_s`, trm/checkpointer.py)."""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType
from typing import Any


class PreemptionFlag:
    """Installs a SIGTERM handler (from the main thread only: Python allows no other) until `restore`."""

    def __init__(self) -> None:
        self.raised_at: float | None = None  # time.time() of the first SIGTERM; None: none came
        self.previous: Any = None  # what signal.signal returned: a handler, SIG_DFL/SIG_IGN, or None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.raised_at is None:
            self.raised_at = time.time()

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
