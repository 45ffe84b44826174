"""Faults that must lose nothing: NaN losses, checkpoint writes that fail, storage that is not there."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contracts.run_summary import RunSummary
from tests.test_train import config
from trm.checkpoints import checkpoint
from trm.run_end import NonFiniteLossError
from trm.train import run


@pytest.mark.slow
def test_nan_loss_fails_fast_without_writing_a_nan_checkpoint(tmp_path: Path, data_root: Path) -> None:
    with pytest.raises((NonFiniteLossError, checkpoint.CheckpointError), match=r"non-finite"):
        run(config(tmp_path, data_root, "train.steps=40", "optim.lr=1e38", "optim.warmup_steps=1"))
    state = checkpoint.load(str(tmp_path / "checkpoints"))
    if state is not None:  # only finite checkpoints may exist
        assert all(bool(v.isfinite().all()) for v in state["model"].values() if v.is_floating_point())
    summary = (tmp_path / "summary.json").read_text()
    assert '"outcome": "FAIL"' in summary and "non-finite" in summary


@pytest.mark.slow
def test_a_checkpoint_write_that_fails_keeps_the_previous_one(tmp_path: Path, data_root: Path) -> None:
    run(config(tmp_path, data_root, "train.steps=20", "train.stop_after=10"))
    before = checkpoint.load(str(tmp_path / "checkpoints"))
    assert before["step"] == 10
    # The next write's temporary file cannot be created (a directory is in its way: like a full or
    # read-only disk, an OSError at write time).
    (tmp_path / "checkpoints" / f"latest.pt.tmp-{os.getpid()}").mkdir()
    with pytest.raises(checkpoint.CheckpointError, match=r"could not write checkpoint"):
        run(config(tmp_path, data_root, "train.steps=20"))
    after = checkpoint.load(str(tmp_path / "checkpoints"))
    assert after["step"] == 10  # intact and loadable
    assert '"outcome": "FAIL"' in (tmp_path / "summary.json").read_text()


@pytest.mark.slow
def test_unreachable_storage_is_one_clear_error_and_nothing_launches(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "sweeps.run", "storage=postgres", "storage.url=postgresql://postgres@127.0.0.1:1/trm",
         f"output_root={tmp_path}/out", f"hydra.run.dir={tmp_path}/h"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert proc.returncode == 2
    assert "127.0.0.1:1" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()
    print(f"[fault] unreachable storage: error after {elapsed:.1f} s")  # reported in docs/reliability.md, not asserted


@pytest.mark.slow
def test_sigterm_checkpoints_then_stops_and_the_run_resumes_from_there(tmp_path: Path, data_root: Path) -> None:
    from contracts.metrics_log import read_metrics
    from tests.test_train import FAST

    args = [*FAST, f"data.root={data_root}", f"out_dir={tmp_path}", "train.steps=100000", "train.eval_interval=100000"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "trm.train", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text()):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    proc.terminate()  # SIGTERM, as a preemption notice
    signalled = time.monotonic()
    out, _ = proc.communicate(timeout=60)
    print(f"[fault] SIGTERM: checkpointed and exited {time.monotonic() - signalled:.1f} s later")
    assert proc.returncode == 0, out[-2000:]
    summary = (tmp_path / "summary.json").read_text()
    assert '"outcome": "PREEMPTED"' in summary
    saved = checkpoint.load(str(tmp_path / "checkpoints"))
    assert saved is not None and saved["step"] % 10 == 0 and saved["step"] > 0
    # The same run resumed (its identity must match: train.steps too), told to stop 10 steps later.
    run(
        config(
            tmp_path,
            data_root,
            "train.steps=100000",
            "train.eval_interval=100000",
            f"train.stop_after={saved['step'] + 10}",
        )
    )
    steps = [r["step"] for r in read_metrics(tmp_path) if "train/lm_loss" in r]
    assert steps[-1] == saved["step"] + 10 and steps == sorted(steps)  # continued, not restarted


@pytest.fixture
def private_pg():
    """A PostgreSQL cluster of this test's own (never the machine's server), stopped and removed after."""
    import shutil
    import tempfile

    from sweeps.launchers.torchrun import free_port

    parent = Path(tempfile.mkdtemp(prefix="trm-sweeps-fault-pg-", dir="/tmp"))
    parent.chmod(0o755)  # as root the server runs as postgres, which must reach data/
    data, port = parent / "data", free_port()
    up = [sys.executable, "-m", "storage.up", "--dir", str(data), "--port", str(port)]
    subprocess.run(up, check=True, capture_output=True, timeout=120)
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/trm_sweeps", up
    finally:
        subprocess.run([*up[:-2], "--stop"], capture_output=True, timeout=120)
        shutil.rmtree(parent, ignore_errors=True)


@pytest.mark.slow
def test_postgres_restart_mid_study_loses_nothing(private_pg, tmp_path: Path) -> None:
    import optuna
    from optuna.trial import TrialState

    from storage import open_storage
    from tests.sweep_helpers import FAST_TRIAL, sweep_overrides, trial_dir, trial_file_exists

    url, up = private_pg
    slow = [o for o in FAST_TRIAL if not o.startswith("train.steps")] + ["train.steps=60"]
    args = sweep_overrides(url, tmp_path, "study=halting", "study.name=outage", "n_trials=2", "pruner=none", trial=slow)
    args = [a.replace("heartbeat.grace_s=4", "heartbeat.grace_s=60") for a in args]
    log = tmp_path / "driver.log"
    driver = subprocess.Popen(
        [sys.executable, "-m", "sweeps.run", *args, f"hydra.run.dir={tmp_path}/h"],
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 180
    while not (
        trial_file_exists(tmp_path / "outage", 0, "run/metrics.jsonl")
        and "eval/" in (trial_dir(tmp_path / "outage", 0) / "run" / "metrics.jsonl").read_text()
    ):
        assert time.monotonic() < deadline and driver.poll() is None, log.read_text()[-2000:]
        time.sleep(0.2)
    subprocess.run([*up[:-2], "--stop"], check=True, capture_output=True, timeout=120)  # the database goes away ...
    time.sleep(5)
    subprocess.run(up, check=True, capture_output=True, timeout=120)  # ... and comes back 5 s later
    restarted = time.monotonic()
    assert driver.wait(timeout=400) == 0, log.read_text()[-3000:]
    print(f"[fault] PostgreSQL down 5 s: study finished {time.monotonic() - restarted:.1f} s after the restart")
    study = optuna.load_study(study_name="outage", storage=open_storage(url))
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.COMPLETE]
    for trial in study.trials:  # every eval report arrived, none lost to the outage
        assert sorted(trial.intermediate_values) == [10, 20, 30, 40, 50, 60], trial.intermediate_values


@pytest.mark.slow
def test_two_drivers_thirty_two_trials_four_at_a_time(pg_url: str, tmp_path: Path) -> None:
    """Two drivers, max_concurrent=4 each, one study, 32 (very short) trials, four rounds of eight at once: no
    duplicate, none lost, no deadlock, and the database connections stay bounded. The jobs come from warm workers
    (four at once per worker), which this also tests under load; how a job process starts does not change what is
    checked."""
    import optuna
    import psycopg2
    from optuna.trial import TrialState

    from storage import open_storage
    from tests.sweep_helpers import FAST_TRIAL, sweep_overrides

    short = [o for o in FAST_TRIAL if not o.startswith(("train.steps", "train.eval_interval", "train.log_interval"))]
    short += ["train.steps=2", "train.eval_interval=2", "train.log_interval=2", "wandb.enabled=false"]
    args = sweep_overrides(
        pg_url,
        tmp_path,
        "study=halting",
        "study.name=soak",
        "n_trials=32",
        "max_concurrent=4",
        "pruner=none",
        "wandb.enabled=false",
        "wandb.summary=false",
        "launcher.warm=true",  # each driver forks its short jobs from one warm worker: ~3 s less start-up per trial
        trial=short,
    )
    logs = [tmp_path / f"driver{i}.log" for i in range(2)]
    drivers = [
        subprocess.Popen(
            [sys.executable, "-m", "sweeps.run", *args, f"hydra.run.dir={tmp_path}/h{i}"],
            stdout=open(log, "w"),
            stderr=subprocess.STDOUT,
        )
        for i, log in enumerate(logs)
    ]
    database = pg_url.rsplit("/", 1)[1]
    peak = 0
    with psycopg2.connect(pg_url.rsplit("/", 1)[0] + "/postgres") as conn:
        conn.autocommit = True
        while any(d.poll() is None for d in drivers):
            with conn.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (database,))
                peak = max(peak, cur.fetchone()[0])
            time.sleep(0.5)
    for driver, log in zip(drivers, logs):
        assert driver.returncode == 0, log.read_text()[-3000:]
    trials = optuna.load_study(study_name="soak", storage=open_storage(pg_url)).trials
    assert sorted(t.number for t in trials) == list(range(32))
    assert all(t.state == TrialState.COMPLETE for t in trials)
    started = [line for log in logs for line in log.read_text().splitlines() if " started" in line]
    assert len(started) == 32  # each trial ran once, split across the drivers
    assert all(any(" started" in line for line in log.read_text().splitlines()) for log in logs)  # both worked
    # Per driver: a bounded pool (2 + 2 overflow) and the budget lock; per running job: one rank-0 pool.
    assert peak <= 2 * (4 + 1) + 2 * 4 * 4, peak
    print(f"[fault] 32 trials, 2 drivers x 4: peak {peak} connections to the study database")


def _start_event(out: str) -> dict:
    import json

    return next(json.loads(line) for line in out.splitlines() if line.startswith('{"event": "start"'))


@pytest.mark.slow
def test_an_unreadable_latest_checkpoint_is_named_and_the_previous_one_resumed(
    tmp_path: Path, data_root: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """A truncated or garbage latest.pt was refused by torch without the file named, and the previous good
    checkpoint was gone. The last two are kept; an unreadable latest.pt is named and previous.pt resumed
    (with a warning naming both), still through the identity check."""
    from contracts.metrics_log import read_metrics

    ckpt = tmp_path / "checkpoints"
    latest, previous = ckpt / checkpoint.LATEST, ckpt / checkpoint.PREVIOUS
    run(config(tmp_path, data_root, "train.steps=30", "train.stop_after=10"))
    run(config(tmp_path, data_root, "train.steps=30", "train.stop_after=20"))
    assert checkpoint.load(str(ckpt))["step"] == 20 and checkpoint.load(str(ckpt), checkpoint.PREVIOUS)["step"] == 10

    latest.write_bytes(latest.read_bytes()[: latest.stat().st_size // 2])  # truncated: a full disk, a killed copy
    with pytest.raises(checkpoint.CheckpointUnreadableError, match=str(latest)):
        checkpoint.load(str(ckpt))
    capsys.readouterr()
    with caplog.at_level("WARNING", logger="trm.checkpoints.checkpoint"):
        summary = run(config(tmp_path, data_root, "train.steps=30"))
    assert _start_event(capsys.readouterr().out)["resumed_from"] == 10
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "trm.checkpoints.checkpoint"]
    assert f"{latest} cannot be read" in warning and f"Resuming from {previous} (step 10)" in warning
    assert summary.outcome == "COMPLETE" and summary.steps == 30
    steps = [r["step"] for r in read_metrics(tmp_path) if "train/lm_loss" in r]
    assert steps == [5, 10, 15, 20, 15, 20, 25, 30]  # steps 15 and 20 trained again from step 10, nothing skipped
    assert (ckpt / "latest.pt.unreadable").is_file()  # kept aside, never rotated over a good previous.pt
    assert checkpoint.load(str(ckpt))["step"] == 30 and checkpoint.load(str(ckpt), checkpoint.PREVIOUS)["step"] == 20

    # The fallback is still checked: previous.pt of this run, resumed by another config, is refused by name.
    latest.write_bytes(b"not a checkpoint at all")
    with pytest.raises(checkpoint.CheckpointMismatchError, match=rf"{previous} was written by another run.*optim.lr"):
        run(config(tmp_path, data_root, "train.steps=30", "optim.lr=0.5"))

    # Neither readable: one error naming both files (a retry would read the same bytes: not retryable).
    latest.write_bytes(b"garbage")
    previous.write_bytes(b"garbage too")
    with pytest.raises(checkpoint.CheckpointUnreadableError) as err:
        run(config(tmp_path, data_root, "train.steps=30"))
    assert (
        str(latest) in str(err.value)
        and str(previous) in str(err.value)
        and "checkpoint.resume=false" in str(err.value)
    )
    assert isinstance(err.value, ValueError)


def test_a_failing_summary_write_does_not_hide_the_error_that_ended_the_run(
    tmp_path: Path, data_root: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """An out_dir that fills up made `_run`'s `finally` raise an OSError writing summary.json, which replaced
    the error that ended the run, and that OSError was what the trial recorded."""
    (tmp_path / "summary.json").mkdir()  # summary.json cannot be written: an OSError in `finally`, as on a full disk
    finished: list[RunSummary] = []

    class Trial:  # what a sweep trial's link records (trm.links.trial.TrialLink: only the first finish counts)
        def report(self, step: int, metrics: dict) -> str:
            return "continue"

        def progress(self, step: int) -> None:
            pass

        def record_outcome(self, summary: RunSummary) -> None:
            finished.append(summary)

    # The run itself fails for another reason: its first checkpoint cannot be written (as in the test above).
    (tmp_path / "checkpoints" / f"latest.pt.tmp-{os.getpid()}").mkdir(parents=True)
    with pytest.raises(checkpoint.CheckpointError, match=r"could not write checkpoint"):
        run(config(tmp_path, data_root, "train.steps=20"), reporter=Trial())
    summary = finished[0]
    error = str(summary.error)
    assert summary.outcome == "FAIL" and error.startswith("CheckpointError") and "could not write checkpoint" in error
    assert "summary.json" not in error
    assert summary.steps == 10 and summary.retryable is True
    err = capfd.readouterr().err
    assert "warning: could not write" in err and "summary.json" in err and "CheckpointError" in err
