"""Ctrl-C and SIGTERM for the driver: the first one stops the sweep, and nothing interrupts the stop.

Python raises KeyboardInterrupt wherever the main thread is when SIGINT arrives. A second Ctrl-C during the
stop (while a job is waited on after its SIGTERM) would abandon the stop half-way: the job, in a session of its
own, would train on and its trial stay RUNNING with nothing recorded. Two guards:

- `interrupt_once`: the driver's handler for SIGINT and SIGTERM. The first raises KeyboardInterrupt (the driver
  stops its jobs and records its trials); every later one only says, once, that the stop is under way.
- `signals_held`: SIGINT and SIGTERM wait until a block ends, then are delivered to the handler that was in
  place before it. A job's stop (sweeps.launchers.workers.JobHandle) runs inside one, so it always finishes:
  every worker gets SIGTERM, and SIGKILL after the grace.
- `ignore_stop_signals`: once the stop is done and the driver exits, later ones are ignored. Python puts back
  the default action for a handled signal while it finalizes, so a Ctrl-C then would kill the driver (exit -2)
  after it had stopped and recorded everything, and a script would read that as a crash, not as 130.

Signal handlers belong to the main thread: in any other thread both are no-ops (no signal is delivered there).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class InterruptOnce:
    """A signal handler: the first signal raises KeyboardInterrupt, later ones print one line and are ignored."""

    def __init__(self) -> None:
        self.received = 0

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.received += 1
        if self.received == 1:
            raise KeyboardInterrupt(signal.Signals(signum).name)
        if self.received == 2:
            print(
                f"{signal.Signals(signum).name} ignored: the driver is already stopping its jobs and recording their "
                "trials, and exits when that is done",
                file=sys.stderr,
                flush=True,
            )


def interrupt_once() -> InterruptOnce | None:
    """Install InterruptOnce for SIGINT and SIGTERM (SIGTERM: a scheduler, `timeout`, a preempted VM stops the
    sweep as Ctrl-C does); None outside the main thread."""
    if not _in_main_thread():
        return None
    handler = InterruptOnce()
    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)
    return handler


def ignore_stop_signals() -> None:
    """Ignore SIGINT and SIGTERM from here to the exit (SIG_IGN survives Python's finalization); main thread only."""
    if _in_main_thread():
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


@contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends, then deliver the first one held (once) to the handler that
    was in place before: the block is never left half-way by a signal."""
    if not _in_main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        held.append(signum)

    previous = {sig: signal.signal(sig, hold) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            # None: a handler installed from C; the default is the closest we can put back.
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if held:
            signal.raise_signal(held[0])
