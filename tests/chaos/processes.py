"""The study's live training processes, read from /proc (matched on the study's name and output root: nothing
else on the machine is ever signalled)."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Job:
    """A training process of the study."""

    pid: int
    ppid: int
    state: str  # R, S, T (stopped), Z ...
    trial: int
    origin: int  # the first trial of its retry chain (whose checkpoints it resumes)
    out_dir: Path


def _arg(argv: list[str], key: str) -> str | None:
    for a in argv:
        if a.startswith(key + "="):
            return a.split("=", 1)[1].strip("'\"")
    return None


def study_jobs(study: str, output_root: Path) -> list[Job]:
    """The live `trm.train` processes of this study."""
    jobs = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
            if "trm.train" not in argv or _arg(argv, "sweep.study") != study:
                continue
            out_dir = _arg(argv, "out_dir")
            if out_dir is None or not out_dir.startswith(str(output_root)):
                continue
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] in ("Z", "X"):
            continue
        trial = int(_arg(argv, "sweep.trial_number") or -1)
        ckpt = (_arg(argv, "checkpoint.url") or "").rstrip("/")
        origin = Path(ckpt).parent.name if ckpt.endswith("/checkpoints") else ""
        origin_n = (
            int(origin.split("-", 1)[1]) if origin.startswith("trial-") and origin.split("-", 1)[1].isdigit() else trial
        )
        jobs.append(Job(int(entry), int(fields[1]), fields[0], trial, origin_n, Path(out_dir)))
    return sorted(jobs, key=lambda j: j.trial)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rfind(")") + 2] not in ("Z", "X")


def logged_step(out_dir: Path) -> int:
    """The last step a job logged (metrics.jsonl in its out_dir; 0 before its first log point)."""
    try:
        lines = (out_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    steps = []
    for line in lines:
        with contextlib.suppress(ValueError, KeyError, TypeError):  # a line being written
            steps.append(int(json.loads(line)["step"]))
    return max(steps, default=0)
