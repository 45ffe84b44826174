"""Preemption: SIGTERM (a preemption notice, a scheduler) sets a flag the training loop checks every few steps
(`train.preemption_check_interval`), so every rank stops at the same step with a checkpoint instead of dying
mid-write."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any


class PreemptionFlag:
    """Installs a SIGTERM handler (from the main thread only: Python allows no other) until `restore`."""

    def __init__(self) -> None:
        self.raised = False
        self.previous: Any = None  # what signal.signal returned: a handler, SIG_DFL/SIG_IGN, or None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.raised = True

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
