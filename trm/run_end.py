"""How a training run ends, and who hears about it.

- `Outcome`: COMPLETE, PRUNED, ABANDONED, PREEMPTED or FAIL, with the error and whether a retry is worth it
  (`NOT_RETRYABLE`: the failures running again would repeat).
- `Reporter`: rank 0's link to whoever watches the run (trm/links/trial.py for a sweep trial): progress, the
  verdict at each eval, the outcome at the end.
- `RunLog`: rank 0's record of the run: every log/eval record to metrics.jsonl and the tracker (W&B,
  trm/tracking/tracker.py) as the run goes; at the end summary.json, the `end` line on stdout and the tracker's summary.
"""

from __future__ import annotations

import errno
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

from contracts.metrics_log import WALL_TIME_KEY
from contracts.out_of_memory import out_of_memory
from contracts.run_summary import RunSummary
from trm.runtime.base import RuntimeMismatchError
from trm.tracking.tracker import Tracker

COMPLETE, PRUNED, ABANDONED, PREEMPTED, FAIL = "COMPLETE", "PRUNED", "ABANDONED", "PREEMPTED", "FAIL"


class NonFiniteLossError(RuntimeError):
    """The loss or the weights went non-finite: the run diverged (no checkpoint of it is written)."""


# Failures that running again would repeat (bad config, bad data, divergence, workers that disagree); any
# other failure (a lost peer, a dead connection, a full disk) is worth a retry from the last checkpoint.
NOT_RETRYABLE = (ValueError, TypeError, KeyError, NonFiniteLossError, RuntimeMismatchError)
# OS errors that a retry on the same disk or bucket, with the same rights, meets again (found anywhere in the
# error's chain: a CheckpointError raised from the OSError of the write): not retried, and the error says so.
# (Not EISDIR: a directory in the way of a checkpoint's temporary file, named by the process id, is not there for
# the retry's process.)
PERMANENT_ERRNOS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOTDIR: "not a directory",  # a file where a directory of the path should be
    errno.ENAMETOOLONG: "file name too long",
}
# What to do about each, for the failure's line (the rest: free space or fix the rights).
PATH_ERRNOS = (errno.ENOTDIR, errno.ENAMETOOLONG)


def permanent_os_error(err: BaseException) -> str | None:
    """What makes `err` fail again on a retry (PERMANENT_ERRNOS), if it or an error it came from is such an
    OSError, or says `[Errno N]` of one (an error rank 0 broadcast to every rank travels as its message); None
    otherwise."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        code = current.errno if isinstance(current, OSError) else None
        said = re.search(r"\[Errno (\d+)\]", str(current))
        for number in (code, int(said.group(1)) if said else None):
            if number in PERMANENT_ERRNOS:
                fix = "fix the path" if number in PATH_ERRNOS else "free space or fix the rights"
                return f"{PERMANENT_ERRNOS[number]} ({errno.errorcode[number]}) fails again on a retry; {fix}"
        current = current.__cause__ or current.__context__
    return None


@dataclass
class Outcome:
    status: str = COMPLETE
    error: str | None = None
    retryable: bool = False
    run_again: bool = False  # the machine failed it (disk full, rights): fixed, the same sweep command resumes it
    rank_steps: list[int] | None = None  # every rank's last step: proof that they all stopped at the same one

    def failed(self, err: BaseException) -> None:
        """Record why the run failed (the error itself still propagates)."""
        self.status, self.error = FAIL, f"{type(err).__name__}: {err}"
        self.retryable = not isinstance(err, NOT_RETRYABLE) and not out_of_memory(self.error)
        permanent = permanent_os_error(err)
        if permanent:
            self.retryable, self.run_again = False, True
            self.error += f" (not retried: {permanent}, then run it again)"


class Reporter(Protocol):
    """Rank 0's link to whoever watches the run (a sweep trial).

    `report` returns the verdict: "continue", "prune" (stop, with a checkpoint) or "abandon" (stop at once:
    the trial was given to someone else). `progress` shows the run is alive (at start and every log point)."""

    def report(self, step: int, metrics: dict[str, float]) -> str: ...

    def progress(self, step: int) -> None: ...

    def record_outcome(self, summary: RunSummary) -> None: ...


class RunLog:
    """Records to `metrics_file` (rank 0's `<out_dir>/metrics.jsonl`; None on other ranks) and the tracker."""

    def __init__(self, out_dir: Path, metrics_file: TextIO | None, tracker: Tracker) -> None:
        self.out_dir, self.metrics_file, self.tracker = out_dir, metrics_file, tracker

    def log(self, record: dict[str, Any]) -> None:
        """One log or eval point: `{"step": n, "<split>/<metric>": value, ...}`; the file's copy is stamped with the
        wall clock (W&B stamps its own)."""
        if self.metrics_file is not None:
            self.metrics_file.write(json.dumps({**record, WALL_TIME_KEY: round(time.time(), 3)}) + "\n")
            self.metrics_file.flush()
        self.tracker.log(record["step"], {k: v for k, v in record.items() if k != "step"})

    def close(self, summary: RunSummary) -> None:
        """Rank 0: close metrics.jsonl, write summary.json and print the `end` line; every rank: finish the tracker."""
        if self.metrics_file is not None:
            written = summary.to_dict()
            # Best-effort: a full or read-only out_dir must not replace the error that ended the run (nor keep the
            # tracker and the trial from recording the real outcome); a failed write is a warning on stderr.
            try:
                self.metrics_file.close()
                (self.out_dir / "summary.json").write_text(json.dumps(written, indent=2))
            except OSError as write_err:
                error = summary.error
                print(
                    f"warning: could not write metrics.jsonl / summary.json in {self.out_dir} "
                    f"({type(write_err).__name__}: {write_err}); the run ended {summary.outcome}"
                    + (f": {error}" if error else ""),
                    file=sys.stderr,
                    flush=True,
                )
            print(json.dumps({"event": "end", **written}), flush=True)
        self.tracker.close(summary)
