"""Checkpoints off the training path (trm/checkpoints/upload.py): rank 0 stages each checkpoint locally and a
background thread uploads it to checkpoint.url with the direct write's guarantees. Real training runs against real
fsspec filesystems: memory:// (a remote store held in this process), and local disks wrapped to be slow or broken."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import fsspec
import pytest

from contracts.run_summary import RunSummary
from tests.fault_stores import DELAY_ENV, BrokenFileSystem, SlowFileSystem, register, site_dir
from tests.test_train import FAST, config
from trm.checkpoints import checkpoint
from trm.checkpoints.upload import STAGED, Uploads
from trm.train import run

pytestmark = pytest.mark.slow  # every test here trains, or starts processes


@pytest.fixture(autouse=True)
def stores() -> None:
    register()
    SlowFileSystem.writes = []


def _start_line(out: str) -> dict:
    return next(json.loads(line) for line in out.splitlines() if line.startswith('{"event": "start"'))


def _memory_url(tmp_path: Path) -> str:
    return f"memory://{tmp_path.name}/checkpoints"  # one remote directory per test in the process-wide store


def test_the_upload_lands_the_staged_bytes_keeps_two_and_a_run_resumes_from_it(
    tmp_path: Path, data_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _memory_url(tmp_path)
    staging = tmp_path / "checkpoint-staging"
    remote = fsspec.filesystem("memory")
    run(config(tmp_path, data_root, "train.steps=30", "train.stop_after=10", f"checkpoint.url={url}"))
    assert _start_line(capsys.readouterr().out)["resumed_from"] == 0
    # Staged locally (never written at out_dir/checkpoints, the default url), the same bytes uploaded.
    assert not (tmp_path / "checkpoints").exists()
    assert remote.cat(f"{url}/latest.pt") == (staging / STAGED).read_bytes()
    assert remote.cat(f"{url}/best.pt") == (staging / STAGED).read_bytes()  # step 10's eval was the first best

    run(config(tmp_path, data_root, "train.steps=30", "train.stop_after=20", f"checkpoint.url={url}"))
    assert _start_line(capsys.readouterr().out)["resumed_from"] == 10  # resumed from the uploaded latest.pt
    assert checkpoint.load(url)["step"] == 20 and checkpoint.load(url, checkpoint.PREVIOUS)["step"] == 10
    assert sorted(p.rsplit("/", 1)[1] for p in remote.ls(url, detail=False)) == ["best.pt", "latest.pt", "previous.pt"]

    summary = run(config(tmp_path, data_root, "train.steps=30", f"checkpoint.url={url}"))
    assert _start_line(capsys.readouterr().out)["resumed_from"] == 20 and summary.outcome == "COMPLETE"
    assert checkpoint.load(url)["step"] == 30 and checkpoint.load(url, checkpoint.PREVIOUS)["step"] == 20
    assert checkpoint.load(url, checkpoint.BEST)["step"] == summary.best_step


def test_the_end_of_a_run_waits_for_its_last_upload(tmp_path: Path, data_root: Path) -> None:
    url = f"{SlowFileSystem.protocol}://{tmp_path}/remote"
    summary = run(config(tmp_path, data_root, "train.steps=20", "checkpoint.keep_best=false", f"checkpoint.url={url}"))
    # Each upload's tmp write is slow; the run returned only once the step-20 checkpoint had landed at the url.
    assert summary.outcome == "COMPLETE"
    assert checkpoint.load(str(tmp_path / "remote"))["step"] == 20
    assert checkpoint.load(str(tmp_path / "remote"), checkpoint.PREVIOUS)["step"] == 10
    assert not list((tmp_path / "remote").glob("*.tmp-*"))


class _TrialLink:
    """A sweep trial's link (trm.links.trial.TrialLink's methods) that does `act()` at one progress step."""

    def __init__(self, at_step: int, act: Callable[[], None]) -> None:
        self.at_step, self.act, self.outcomes = at_step, act, []

    def report(self, step: int, metrics: dict) -> str:
        return "continue"

    def progress(self, step: int) -> None:
        if step == self.at_step:
            self.act()

    def record_outcome(self, summary: RunSummary) -> None:
        self.outcomes.append(summary)


def _sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # a preemption notice: the PreemptionFlag the run installed catches it


def _storage_gone() -> None:
    raise ConnectionError("the study storage went away")


def test_a_preempted_run_waits_for_the_upload_of_its_last_checkpoint(tmp_path: Path, data_root: Path) -> None:
    url = f"{SlowFileSystem.protocol}://{tmp_path}/remote"
    trial = _TrialLink(15, _sigterm)
    summary = run(
        config(tmp_path, data_root, "train.steps=100", "train.eval_interval=50", f"checkpoint.url={url}"),
        reporter=trial,
    )
    assert summary.outcome == "PREEMPTED" and summary.steps == 20  # the check at step 20 saw the flag
    assert [s.outcome for s in trial.outcomes] == ["PREEMPTED"]
    # The preemption's save (no eval before it) landed before the run said it had stopped.
    assert checkpoint.load(str(tmp_path / "remote"))["step"] == 20


def test_a_run_that_fails_waits_for_the_upload_in_flight(tmp_path: Path, data_root: Path) -> None:
    url = f"{SlowFileSystem.protocol}://{tmp_path}/remote"
    trial = _TrialLink(15, _storage_gone)  # the step-10 upload is still in flight 5 steps later (its write is slow)
    with pytest.raises(ConnectionError):
        run(config(tmp_path, data_root, "train.steps=100", f"checkpoint.url={url}"), reporter=trial)
    assert checkpoint.load(str(tmp_path / "remote"))["step"] == 10  # the retry resumes from it
    assert trial.outcomes[0].outcome == "FAIL" and "ConnectionError" in str(trial.outcomes[0].error)


def test_a_failing_upload_fails_the_run_and_keeps_what_was_there(tmp_path: Path, data_root: Path) -> None:
    remote = tmp_path / "remote"
    checkpoint.save(str(remote), checkpoint.LATEST, {"step": 3})  # a complete checkpoint of an earlier attempt
    url = f"{BrokenFileSystem.protocol}://{remote}"
    with pytest.raises(checkpoint.CheckpointError, match=r"could not upload checkpoint step 10 to .*403 Forbidden"):
        run(config(tmp_path, data_root, "train.steps=20", "checkpoint.resume=false", f"checkpoint.url={url}"))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["outcome"] == "FAIL" and summary["retryable"] is True and "CheckpointError" in summary["error"]
    assert summary["steps"] == 20  # the failure of the step-10 upload surfaced at the next save
    assert checkpoint.load(str(remote))["step"] == 3 and sorted(p.name for p in remote.iterdir()) == ["latest.pt"]


def test_an_upload_cut_short_leaves_the_previous_complete_checkpoint_resumable(
    tmp_path: Path, data_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job killed mid-upload leaves a tmp file at the url (and, between the two moves, no latest.pt): a retry
    resumes from the complete checkpoint, never from the partial one."""
    url = _memory_url(tmp_path)
    remote = fsspec.filesystem("memory")
    run(config(tmp_path, data_root, "train.steps=30", "train.stop_after=10", f"checkpoint.url={url}"))
    complete = remote.cat(f"{url}/latest.pt")
    remote.pipe(f"{url}/latest.pt.tmp-12345", complete[: len(complete) // 3])  # the killed upload's partial write
    capsys.readouterr()
    run(config(tmp_path, data_root, "train.steps=30", "train.stop_after=20", f"checkpoint.url={url}"))
    assert _start_line(capsys.readouterr().out)["resumed_from"] == 10

    # Killed between the rotation and the rename: previous.pt (step 20) and the tmp file of step 30, no latest.pt.
    remote.mv(f"{url}/latest.pt", f"{url}/previous.pt")
    run(config(tmp_path, data_root, "train.steps=30", f"checkpoint.url={url}"))
    assert _start_line(capsys.readouterr().out)["resumed_from"] == 20


def test_at_most_one_upload_in_flight_and_they_land_in_order(tmp_path: Path) -> None:
    """A second start while one is in flight is refused; waiting, then starting, lands the newer checkpoint over
    the older (rotated to previous.pt), never the reverse."""
    url = f"{SlowFileSystem.protocol}://{tmp_path}/remote"
    uploads = Uploads()
    for step in (1, 2):
        source = tmp_path / f"staged-{step}.pt"
        source.write_bytes(bytes(checkpoint.encode({"step": step})))
        assert uploads.wait(None) is None
        uploads.start(url, step, source, [checkpoint.LATEST])
        with pytest.raises(RuntimeError, match=rf"an upload \(step {step} to .*latest.pt\) is in flight"):
            uploads.start(url, step, source, [checkpoint.LATEST])
    assert uploads.wait(None) is None
    assert checkpoint.load(str(tmp_path / "remote"))["step"] == 2
    assert checkpoint.load(str(tmp_path / "remote"), checkpoint.PREVIOUS)["step"] == 1


def test_a_bounded_wait_names_an_upload_still_running_once(tmp_path: Path) -> None:
    source = tmp_path / "staged.pt"
    source.write_bytes(bytes(checkpoint.encode({"step": 7})))
    uploads = Uploads()
    uploads.start(f"{SlowFileSystem.protocol}://{tmp_path}/remote", 7, source, [checkpoint.LATEST])
    late = uploads.wait(0.01)
    assert late is not None and "step 7 to" in late and "still running after checkpoint.upload_wait_s=0.01 s" in late
    assert uploads.wait(0.01) is None  # reported once: the error path after a failed stop does not wait again


def test_a_job_killed_mid_upload_is_resumed_from_the_last_complete_upload(
    tmp_path: Path, data_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    remote = tmp_path / "remote"
    url = f"{SlowFileSystem.protocol}://{remote}"
    args = [*FAST, f"data.root={data_root}", f"out_dir={tmp_path}", "train.steps=100000", f"checkpoint.url={url}"]
    env = {**os.environ, "PYTHONPATH": str(site_dir(tmp_path)), DELAY_ENV: "3"}
    proc = subprocess.Popen([sys.executable, "-m", "trm.train", *args], env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        # A complete upload, then the next one half-written (its tmp file holds half the bytes, for 3 s).
        while not ((remote / "latest.pt").exists() and any(p.stat().st_size for p in remote.glob("*.tmp-*"))):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.kill()
    finally:
        proc.wait(timeout=60)
    done = checkpoint.load(str(remote))["step"]
    assert list(remote.glob("*.tmp-*"))  # the killed upload's partial file is still there ...
    capsys.readouterr()
    run(config(tmp_path, data_root, "train.steps=100000", f"train.stop_after={done + 10}", f"checkpoint.url={url}"))
    assert _start_line(capsys.readouterr().out)["resumed_from"] == done  # ... and never read


def test_a_failing_upload_stops_every_rank_of_a_job_with_a_checkpoint_error(tmp_path: Path) -> None:
    from sweeps.launchers.base import JobSpec
    from sweeps.launchers.torchrun import TorchrunLauncher
    from tests.test_distributed import JOB

    url = f"{BrokenFileSystem.protocol}://{tmp_path}/remote"
    spec = JobSpec(
        "upload-fails",
        [*JOB, f"out_dir={tmp_path / 'out'}", "train.steps=10", f"checkpoint.url={url}"],
        tmp_path / "job",
        env={"PYTHONPATH": str(site_dir(tmp_path))},
    )
    handle = TorchrunLauncher(nnodes=2, nproc_per_node=1).launch(spec)
    assert handle.wait(400) not in (None, 0)
    for node in range(2):
        log = (tmp_path / "job" / f"node-{node}.log").read_text()
        assert "CheckpointError: could not upload checkpoint step 10" in log and "403 Forbidden" in log, log[-3000:]
    assert not (tmp_path / "remote" / "latest.pt").exists()


def test_a_staged_multi_process_job_keeps_each_ranks_carry_and_resumes_it(tmp_path: Path) -> None:
    """torch (gloo, DDP): each rank's own carry is saved, uploaded (staging=always, a local directory as the
    store) and resumed; no global carry is saved beside them (that is SPMD's)."""
    from sweeps.launchers.base import JobSpec
    from sweeps.launchers.torchrun import TorchrunLauncher
    from tests.test_distributed import JOB

    remote, out = tmp_path / "remote", tmp_path / "out"
    job = [*JOB, f"out_dir={out}", "train.steps=20", f"checkpoint.url={remote}", "checkpoint.staging=always"]
    for stop, name in (("train.stop_after=10", "first"), ("train.stop_after=null", "resumed")):
        handle = TorchrunLauncher(nnodes=2, nproc_per_node=1).launch(JobSpec(name, [*job, stop], tmp_path / name))
        assert handle.wait(400) == 0, handle.failure
    assert _start_line((tmp_path / "resumed" / "node-0.log").read_text())["resumed_from"] == 10
    previous = checkpoint.load(str(remote), checkpoint.PREVIOUS)
    assert previous["step"] == 10 and previous["carry"] is None and len(previous["ranks"]) == 2
    carries = [r["carry"]["inputs"] for r in previous["ranks"]]
    assert not bool((carries[0] == carries[1]).all())  # each rank's own puzzles
    assert json.loads((out / "summary.json").read_text())["rank_steps"] == [20, 20]


def test_a_stop_ends_within_its_kill_grace_cutting_a_save_that_would_not(
    tmp_path: Path, data_root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A notice's save waited for the upload in flight without bound and its own upload for checkpoint.upload_wait_s
    (90 s): past the pod's 120 s SIGKILL. With checkpoint.stop_grace_s (the launcher's kill_grace_s) the stop ends
    by then: here 11 s less the 2.75 s kept for the exit (a quarter) leave 8.25 s, less than the step-10 upload took
    (9 s)."""
    monkeypatch.setenv(DELAY_ENV, "9")
    url = f"{SlowFileSystem.protocol}://{tmp_path}/remote"
    signalled: list[float] = []

    def notice() -> None:  # once the step-10 upload landed (the stop's wait for one in flight is the other bound)
        while not (tmp_path / "remote" / checkpoint.LATEST).exists():
            time.sleep(0.1)
        signalled.append(time.monotonic())
        _sigterm()

    trial = _TrialLink(15, notice)
    extra = ("train.steps=100", "train.eval_interval=10", "checkpoint.keep_best=false", f"checkpoint.url={url}")
    summary = run(config(tmp_path, data_root, *extra, "checkpoint.stop_grace_s=11"), reporter=trial)
    stopped_s = time.monotonic() - signalled[0]
    assert summary.outcome == "PREEMPTED" and summary.steps == 20
    assert stopped_s < 11, f"the stop took {stopped_s:.1f} s, past its 11 s grace"
    assert checkpoint.load(str(tmp_path / "remote"))["step"] == 10  # landed within the grace; step 20's was cut
    err = capsys.readouterr().err
    assert "the stop's checkpoint of step 20 was not written" in err and "checkpoint.stop_grace_s=11" in err


def test_every_launcher_tells_each_job_its_kill_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the pod told its jobs their kill grace: a local or torchrun job's stop had no deadline, so a slow stop
    save met the SIGKILL 10 s after the SIGTERM. Every launcher tells it now, the warm worker's jobs too."""
    from sweeps.launchers.base import JobSpec
    from sweeps.launchers.local import LocalLauncher
    from sweeps.launchers.torchrun import TorchrunLauncher
    from sweeps.launchers.tpu.launcher import TpuPodLauncher

    spec = JobSpec("j", ["train.steps=3"], Path("."))
    pods = TpuPodLauncher(tpu_name="t", zone="z", kill_grace_s=95)
    assert "checkpoint.stop_grace_s=95 " in pods.remote_command(spec)
    assert "checkpoint.stop_grace_s=7" in LocalLauncher(kill_grace_s=7).command(spec)
    assert "checkpoint.stop_grace_s=8" in TorchrunLauncher(kill_grace_s=8).command(spec, 0, 29500)
    forked: list[list[str]] = []
    warm = LocalLauncher(warm=True, kill_grace_s=6)
    monkeypatch.setattr(warm, "warm_worker", lambda logs: SimpleNamespace(fork=lambda o, *a: forked.append(o)))
    warm.launch(spec)
    assert "checkpoint.stop_grace_s=6" in forked[0]


@pytest.mark.parametrize(("grace", "deadline"), [(10.0, 107.5), (120.0, 210.0), (2.0, 101.5)])
def test_a_stops_exit_reserve_is_a_share_of_its_grace_not_all_of_it(grace: float, deadline: float) -> None:
    """The reserve for the exit was 10 s whatever the grace: with the local launchers' 10 s grace a stop's save had
    no time at all. It is a quarter of the grace, at most 10 s."""
    from trm.checkpointer import Checkpointer

    settings = SimpleNamespace(stop_grace_s=grace, upload_wait_s=90.0)
    checkpointer = Checkpointer(None, None, settings)  # type: ignore[arg-type]
    checkpointer.stop_from(100.0)
    assert checkpointer.deadline == pytest.approx(deadline)
