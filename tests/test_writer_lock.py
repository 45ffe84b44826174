"""One writer per checkpoint directory (trm/checkpoints/writer_lock.py): a job waits for another process still writing
its checkpoint directory (a dead driver's orphan) and resumes only after it let go; the kernel frees the lock of a
process that died however it died."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from trm.checkpoints.writer_lock import LOCK_FILE, CheckpointBusyError, acquire, held

ROOT = Path(__file__).resolve().parents[1]


def test_a_held_directory_is_refused_after_the_wait_naming_its_holder(tmp_path: Path) -> None:
    first = acquire(str(tmp_path / "ckpt"), wait_s=0)
    assert first is not None
    start = time.monotonic()
    with pytest.raises(CheckpointBusyError, match=r"still being written by process \d+ after 0.3 s"):
        acquire(str(tmp_path / "ckpt"), wait_s=0.3, poll_s=0.05)
    assert time.monotonic() - start >= 0.3
    first.close()  # the holder let go: the next writer takes it
    with held(str(tmp_path / "ckpt"), 0, is_main=True):
        assert (tmp_path / "ckpt" / LOCK_FILE).exists()
    assert acquire("gs://bucket/run", 0) is None  # no OS lock on an object store
    with held(str(tmp_path / "other"), 0, is_main=False):
        assert not (tmp_path / "other").exists()  # ranks other than 0 write no checkpoint file: no lock


@pytest.mark.slow
def test_a_job_waits_for_the_process_still_writing_its_checkpoints_then_resumes(tmp_path: Path) -> None:
    # The "orphan" is a process that holds the lock and is then killed -9: the kernel frees it.
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from trm.checkpoints.writer_lock import acquire; "
         f"h = acquire({str(tmp_path / 'run' / 'checkpoints')!r}, 0); print('held', flush=True); time.sleep(600)"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert orphan.stdout is not None and orphan.stdout.readline().strip() == "held"
    args = ["experiment=test_tiny", "train.steps=4", "train.log_interval=2", "train.eval_interval=4"]
    args += [f"data.root={tmp_path / 'data'}", f"out_dir={tmp_path / 'run'}", "checkpoint.lock_wait_s=120"]
    job = subprocess.Popen(
        [sys.executable, "-m", "trm.train", *args],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert job.stderr is not None
    waited = ""
    while f"waiting for process {orphan.pid}" not in waited:
        line = job.stderr.readline()
        assert line, f"the job ended without waiting: {waited}"
        waited += line
    time.sleep(2)
    assert job.poll() is None and not (tmp_path / "run" / "checkpoints" / "latest.pt").exists()  # wrote nothing
    orphan.kill()
    orphan.wait()
    job.stderr.read()
    assert job.wait(timeout=300) == 0
    assert (tmp_path / "run" / "checkpoints" / "latest.pt").exists()
    assert (tmp_path / "run" / "checkpoints" / LOCK_FILE).read_text().strip() == str(job.pid)
