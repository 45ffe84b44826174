"""The tpu_pod launcher against a stand-in `gcloud` (tests/fake_gcloud): every worker VM a real process in
its own directory and HOME, with the environment a TPU VM gives, the gloo control plane on loopback."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import torch
import yaml
from optuna.trial import TrialState

from storage.record import reevals
from sweeps.config.compose import compose_sweep_config
from sweeps.config.typed_config import typed_sweep
from sweeps.driver import Driver
from sweeps.launchers.base import JobSpec, LauncherConfigError
from sweeps.launchers.torchrun import free_port
from sweeps.launchers.tpu.launcher import TpuPodLauncher
from tests.sweep_helpers import FAKE_GCLOUD, FAST_TRIAL, fake_pod, stand_in_pod_overrides, trial_dir, trial_list

NOTE = """a b "c" [e,f] $HOME `x` ; end"""  # spaces, quotes, brackets, $, backticks: must arrive unchanged


@pytest.fixture
def pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return fake_pod(tmp_path, monkeypatch, 2)


def training_processes() -> dict[str, str]:
    """{TPU_WORKER_ID: pid} of the fake VMs' training processes (not the local gcloud clients, nor the shells on
    the VMs that run them)."""
    found = {}
    for pid in subprocess.run(["pgrep", "-f", "[s]weep.job=pod-job-1"], capture_output=True, text=True).stdout.split():
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() in ("sh", "bash"):
                continue
            env = dict(
                kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if "=" in kv
            )
        except OSError:
            continue
        if "TPU_WORKER_ID" in env:
            found[env["TPU_WORKER_ID"]] = pid
    return found


def launcher(**kw) -> TpuPodLauncher:
    args = dict(
        tpu_name="test-pod",
        zone="us-central2-b",
        gcloud=str(FAKE_GCLOUD),
        python=sys.executable,
        env={},
        remote_dir="~/trm",
    )
    return TpuPodLauncher(**{**args, **kw})


def job(tmp_path: Path, *extra: str) -> JobSpec:
    overrides = [
        *FAST_TRIAL,
        "runtime.backend=torch",
        f"runtime.port={free_port()}",
        "hydra.run.dir=hydra",
        "out_dir=run",
        *extra,
    ]
    return JobSpec("pod-job-1", overrides, tmp_path / "local")


@pytest.mark.slow
def test_every_worker_runs_the_job_in_its_own_directory_with_quoting_intact(pod: Path, tmp_path: Path) -> None:
    pods = launcher()
    pods.prepare()  # reaches every worker
    handle = pods.launch(job(tmp_path, f"+extra.note='{NOTE}'"))
    assert handle.wait(300) == 0, handle.failure
    for worker in (0, 1):
        vm = pod / "test-pod" / f"worker-{worker}" / "trm"
        config = yaml.safe_load((vm / "hydra" / ".hydra" / "config.yaml").read_text())
        assert config["extra"]["note"] == NOTE
        assert (vm / "outputs" / "data").is_dir()  # each VM built its own dataset
    summary = json.loads((pod / "test-pod" / "worker-0" / "trm" / "run" / "summary.json").read_text())
    assert summary["outcome"] == "COMPLETE" and summary["rank_steps"] == [20, 20]
    assert not (pod / "test-pod" / "worker-1" / "trm" / "run" / "summary.json").exists()  # rank 0 alone writes
    calls = (pod / "calls.log").read_text()
    assert "'--worker=0'" in calls and "'--worker=1'" in calls and "'--zone=us-central2-b'" in calls


def vm_sessions(worker: int) -> list[int]:
    """The pids of the stand-in VM's ssh sessions running pod-job-1 (the shell gcloud's --command runs in)."""
    found = []
    for pid in subprocess.run(["pgrep", "-f", "[p]od-job-1"], capture_output=True, text=True).stdout.split():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:2] == [b"bash", b"-c"] and b"pod-job-1" in argv[2] and f"TPU_WORKER_ID={worker}".encode() in env:
            found.append(int(pid))
    return found


@pytest.mark.slow
def test_a_dropped_ssh_session_attaches_again_and_the_job_goes_on(pod: Path, tmp_path: Path) -> None:
    """ssh's 255 (the connection dropped: here the VM's session is killed) makes gcloud run the command again.
    The job runs detached from the session, so it goes on; the command run again attaches to it instead of
    starting a second copy beside it, and ends with the job's own status."""
    handle = launcher().launch(job(tmp_path, "train.steps=400", "train.eval_interval=100000"))
    try:
        metrics = pod / "test-pod" / "worker-0" / "trm" / "run" / "metrics.jsonl"
        deadline = time.monotonic() + 180
        while not (metrics.exists() and metrics.read_text() and training_processes().keys() == {"0", "1"}):
            assert time.monotonic() < deadline and handle.poll() is None, handle.failure
            time.sleep(0.2)
        before = training_processes()
        (session,) = vm_sessions(1)
        os.kill(session, signal.SIGKILL)  # what a dropped connection is to gcloud: ssh exits 255
        time.sleep(2)
        assert training_processes() == before  # the same training processes, no second one on worker 1
        assert handle.wait(300) == 0, handle.failure
        log = (tmp_path / "local" / "worker-1.log").read_text()
        assert log.count("Attempting to connect to worker 1") == 2 and "attached to the job this command started" in log
        summary = json.loads((pod / "test-pod" / "worker-0" / "trm" / "run" / "summary.json").read_text())
        assert summary["outcome"] == "COMPLETE" and summary["rank_steps"] == [400, 400]
    finally:
        if handle.poll() is None:  # failed: leave no job behind
            handle.cancel()


@pytest.mark.slow
def test_a_session_run_again_prints_what_the_job_wrote_while_none_was_attached(tmp_path: Path) -> None:
    """The VM's command itself, in sh: the first session is killed (a dropped connection) after the job's first
    line; the job writes its second while no session follows it; the command run again prints from there on, the
    first line not twice, and exits with the job's status."""
    from sweeps.launchers.tpu.shell import job_command

    job = "echo one; while [ ! -e go ]; do sleep 0.1; done; echo two; sleep 0.5; echo three; sh -c 'exit 3'"
    command = job_command("true", job, "launch-1")
    first = subprocess.Popen(["sh", "-c", command], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    assert first.stdout is not None and first.stdout.readline() == "one\n"
    sent = tmp_path / ".trm-jobs" / "launch-1.sent"
    deadline = time.monotonic() + 30
    while not (sent.exists() and sent.read_text().strip() == "4"):  # the session has handed "one\n" to ssh
        assert time.monotonic() < deadline
        time.sleep(0.05)
    first.kill()  # the job is in a session of its own: it goes on
    first.wait()
    (tmp_path / "go").touch()
    log = tmp_path / ".trm-jobs" / "launch-1.log"
    deadline = time.monotonic() + 30
    while "two" not in log.read_text():  # written while no session is attached
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    again = subprocess.run(["sh", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert again.returncode == 3, again.stderr
    assert again.stdout == "two\nthree\n" and "attached to the job this command started" in again.stderr


@pytest.mark.slow
def test_a_killed_worker_ends_the_job_named_and_cancel_reaches_every_vm(pod: Path, tmp_path: Path) -> None:
    handle = launcher().launch(job(tmp_path, "train.steps=100000", "train.eval_interval=100000"))
    metrics = pod / "test-pod" / "worker-0" / "trm" / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while not (metrics.exists() and metrics.read_text()):
        assert time.monotonic() < deadline and handle.poll() is None, handle.failure
        time.sleep(0.2)
    workers = training_processes()
    assert sorted(workers) == ["0", "1"]  # one training process per VM
    worker1 = workers["1"]
    os.kill(int(worker1), signal.SIGKILL)
    killed_at = time.monotonic()
    # 128 + SIGKILL, passed on by the VM's shell: a status of 255 would have made gcloud run the job again there.
    assert handle.wait(90) == 128 + signal.SIGKILL
    assert time.monotonic() - killed_at < 60
    print(f"[fault] SIGKILL of a pod worker: job ended {time.monotonic() - killed_at:.1f} s later")
    assert handle.failed_worker == "worker-1"
    assert (tmp_path / "local" / "worker-1.log").read_text().count("Attempting to connect to worker 1") == 1
    time.sleep(1)
    assert not training_processes()  # the remote pkill stopped worker 0's training too, not only the local ssh


@pytest.mark.slow  # runs the gcloud stand-in or git: a process
def test_missing_tpu_name_or_zone_and_unknown_workers_are_config_errors(pod: Path) -> None:
    from sweeps.launchers.base import LauncherConfigError

    with pytest.raises(LauncherConfigError, match="launcher.tpu_name=None"):
        launcher(tpu_name=None).validate()
    with pytest.raises(LauncherConfigError, match="launcher.zone=''"):
        launcher(zone="").validate()
    with pytest.raises(LauncherConfigError, match="launcher.workers='0,5'"):
        launcher(workers="0,5").validate()
    with pytest.raises(LauncherConfigError, match="launcher.gcloud='no-such-gcloud'"):
        launcher(gcloud="no-such-gcloud").validate()
    # libtpu waits for every VM of the slice: a pod job on some of them would hang until the stall timeout.
    with pytest.raises(LauncherConfigError, match="launcher.workers='1' with launcher.slots=pod"):
        launcher(workers="1").validate()
    launcher(workers="1", slots="vm").validate()  # a trial per VM: each job is a one-VM slice of its own


@pytest.mark.slow  # runs the gcloud stand-in or git: a process
def test_a_sqlite_study_on_a_pod_is_refused_before_anything_runs(pod: Path, tmp_path: Path) -> None:
    """The VMs' rank 0 would open another, empty file of that name on its own disk (the stand-in pod shares this
    machine's disk, so only the check stands between a researcher and trials failing at their first report)."""
    from sweeps.validation.validate import SweepConfigError

    db = tmp_path / "optuna.db"
    cfg = compose_sweep_config(
        ["site=pod", "launcher.tpu_name=test-pod", "launcher.zone=us-central2-b", f"launcher.gcloud={FAKE_GCLOUD}",
         "storage=sqlite", f"storage.url=sqlite:///{db}", f"output_root={tmp_path}/out", "study=halting"]
    )  # fmt: skip
    with pytest.raises(SweepConfigError, match=rf"^storage.url='sqlite:///{db}': a SQLite file on this machine, but "
                       r"TpuPodLauncher's workers share no filesystem .* use storage=postgres"):  # fmt: skip
        Driver(typed_sweep(cfg)).validate()
    assert not db.exists()


@pytest.mark.slow
def test_a_study_on_the_fake_pod(pod: Path, tmp_path: Path, fresh_pg_url: str) -> None:
    db = fresh_pg_url  # the VMs' rank 0 reports to a server, as on a pod (a SQLite file here is refused)
    cfg = compose_sweep_config(
        [
            *stand_in_pod_overrides(db, tmp_path / "out", sys.executable),
            "pruner=none",
            f"trial.overrides={trial_list([*FAST_TRIAL, 'runtime.backend=torch', f'runtime.port={free_port()}'])}",
            "heartbeat.interval_s=1",
            "poll_s=0.2",
            f"preflight.expect={{torch: '{torch.__version__}', torch_xla: null}}",  # the driver's preflight passes
            "preflight.chips_glob='~/dev/accel*'",
            "preflight.min_free_gb=0",
        ]
    )
    Driver(typed_sweep(cfg)).run()
    study = optuna.load_study(study_name="halting", storage=db)
    trial = study.trials[0]
    assert trial.state == TrialState.COMPLETE, trial.user_attrs
    ckpt = trial_dir(pod / "test-pod" / "worker-0" / "trm" / "runs" / "halting", 0) / "checkpoints" / "latest.pt"
    assert ckpt.exists()  # on worker 0's own disk, where its retry would find it
    # The study's end re-evaluated it on the pod too (reeval.at_end): a job on both VMs, best.pt read on worker 0.
    again = reevals(study.user_attrs)[0]
    assert again.examples == 32 and again.step == trial.user_attrs["best_step"]
    logs = sorted(p.name for p in (Path(trial.user_attrs["workdir"]) / "reeval").glob("worker-*.log"))
    assert logs == ["worker-0.log", "worker-1.log"]


@pytest.mark.slow
def test_deploy_installs_one_wheel_on_every_worker(pod: Path, tmp_path: Path) -> None:
    """launcher.deploy=true with launcher.wheel: the wheel a user installed is copied to and installed on every VM
    (each its own venv here, `$HOME/venv`, as each VM has its own disk)."""
    root = Path(__file__).resolve().parent.parent
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(root)],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("trm_sweeps-*.whl")
    vms = [pod / "test-pod" / f"worker-{w}" for w in (0, 1)]
    subprocess.run([sys.executable, "-m", "venv", str(vms[0] / "venv")], check=True)
    # A copy is a venv of its own (its prefix is where its pyvenv.cfg is): the same as a second `venv`, without
    # ensurepip's 5 s.
    shutil.copytree(vms[0] / "venv", vms[1] / "venv", symlinks=True)
    launcher(deploy=True, wheel=str(wheel), python="$HOME/venv/bin/python").prepare()
    for vm in vms:
        assert (vm / "trm" / wheel.name).is_file()
        shown = subprocess.run(
            [str(vm / "venv" / "bin" / "python"), "-m", "pip", "show", "-f", "trm-sweeps"],
            capture_output=True,
            text=True,
        )
        assert shown.returncode == 0 and "trm_sweeps_conf/study/model_scaling.yaml" in shown.stdout


@pytest.mark.slow  # runs the gcloud stand-in or git: a process
def test_deploy_from_an_installed_copy_asks_for_the_wheel(
    pod: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An installed trm-sweeps has no checkout to build a wheel from: refused before any VM is contacted, naming
    launcher.wheel; a launcher.wheel that is not a wheel file is refused too."""
    from sweeps.launchers.base import LauncherConfigError
    from sweeps.launchers.tpu import setup as pod_setup

    monkeypatch.setattr(pod_setup, "CHECKOUT", tmp_path / "site-packages")
    with pytest.raises(LauncherConfigError, match=r"set launcher.wheel=/path/to/trm_sweeps-<version>.whl"):
        launcher(deploy=True).validate()
    with pytest.raises(LauncherConfigError, match=r"launcher.wheel='.*nothing.whl': not a wheel file"):
        launcher(deploy=True, wheel=str(tmp_path / "nothing.whl")).validate()
    launcher(deploy=False).validate()  # nothing to deploy: nothing to build
    assert not (pod / "calls.log").exists()


def test_the_legacy_xla_dist_launcher_is_gone() -> None:
    """launcher=xla_dist drove torch_xla < 2.1, whose runtime trm/runtime/xla.py cannot run on: removed, so the
    launcher group offers only launchers that can train here (Hydra names the ones it has)."""
    from sweeps.config.config_values import SweepConfigError  # Hydra's MissingConfigException, as one line

    with pytest.raises(
        SweepConfigError, match=r"Could not find 'launcher/xla_dist' Available options in 'launcher': _base local"
    ):
        compose_sweep_config(["launcher=xla_dist"])


@pytest.mark.slow
def test_every_gcloud_call_is_quiet_and_carries_the_ssh_flags(pod: Path, tmp_path: Path) -> None:
    """The first ssh sets up keys and would prompt (no terminal: the stand-in fails it, as gcloud does) unless
    --quiet; VMs without an external IP need --internal-ip (or --tunnel-through-iap) on every ssh and scp."""
    wheel = tmp_path / "trm_sweeps-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    pods = launcher(ssh_flags=["--internal-ip"], deploy=True, wheel=str(wheel), python="true")
    pods.prepare()
    calls = [eval(line) for line in (pod / "calls.log").read_text().splitlines()]
    assert {c[3] for c in calls} == {"ssh", "scp"}
    assert all("--quiet" in c and "--internal-ip" in c for c in calls), calls
    with pytest.raises(LauncherConfigError, match=r"launcher.ssh_flags=\['internal-ip'\]"):
        launcher(ssh_flags=["internal-ip"]).validate()


@pytest.mark.slow
def test_an_old_python3_on_the_vms_is_refused_naming_the_key_and_the_fix(pod: Path) -> None:
    """The stand-in VMs' python3 is 3.10 (as TPU VM images have shipped): refused at prepare, before any trial,
    naming every worker in worker order (they answer in any order)."""
    with pytest.raises(
        LauncherConfigError,
        match=r"launcher.python='python3' is older than Python 3.11 "
        r"\(worker 0 python 3.10.12; worker 1 python 3.10.12\)",
    ):
        launcher(python="python3").prepare()


@pytest.mark.slow
def test_a_python_under_home_is_expanded_by_the_vm_shell(pod: Path, tmp_path: Path) -> None:
    """launcher.python=~/... is each VM's own home (the VM's shell expands `~`; quoted whole it would not)."""
    for worker in (0, 1):
        bin_dir = pod / "test-pod" / f"worker-{worker}" / "venv" / "bin"
        bin_dir.mkdir(parents=True)
        (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')  # the VM's own venv
        (bin_dir / "python").chmod(0o755)
    handle = launcher(python="~/venv/bin/python", remote_dir="~/my trm").launch(job(tmp_path))
    assert handle.wait(300) == 0, handle.failure
    assert (pod / "test-pod" / "worker-0" / "my trm" / "run" / "summary.json").is_file()


@pytest.mark.slow
def test_a_job_ignoring_sigterm_is_killed_after_the_grace_on_every_vm(pod: Path, tmp_path: Path) -> None:
    """A job stuck where it cannot act on SIGTERM (compiling, TPU start-up, a collective) would keep its chips:
    the stop sends SIGKILL on the VMs after launcher.kill_grace_s."""
    stuck = tmp_path / "python-ignoring-sigterm"
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    stuck.write_text(f"#!/bin/sh\nexec {sys.executable} -c '{code}' \"$@\"\n")
    stuck.chmod(0o755)
    handle = launcher(python=str(stuck), kill_grace_s=1).launch(job(tmp_path))
    try:
        deadline = time.monotonic() + 60
        while sorted(training_processes()) != ["0", "1"]:
            assert time.monotonic() < deadline and handle.poll() is None, handle.failure
            time.sleep(0.2)
        handle.cancel()
        assert not training_processes()
    finally:
        for pid in training_processes().values():
            os.kill(int(pid), signal.SIGKILL)


@pytest.mark.slow
def test_the_control_plane_keeps_off_libtpus_ports_and_names_the_key_when_its_port_is_taken(
    pod: Path, tmp_path: Path
) -> None:
    """On worker 0 the TPU runtime holds libtpu's ports while a job runs (the stand-in's too): the default
    runtime.port is not one of them, and a port that is taken fails the job in one line naming runtime.port and
    what the network must allow."""
    from contracts.hydra_app import compose_train_config
    from sweeps.launchers.slots import LIBTPU_PORTS

    assert compose_train_config([]).runtime.port not in LIBTPU_PORTS
    spec = job(tmp_path)
    spec.overrides = [o for o in spec.overrides if not o.startswith("runtime.port=")] + ["runtime.port=8476"]
    handle = launcher().launch(spec)
    assert handle.wait(300) not in (None, 0)
    log = (tmp_path / "local" / "worker-0.log").read_text()
    line = next(line for line in log.splitlines() if "runtime.port=8476:" in line)
    assert "must be free" in line and "ephemeral port" in line


@pytest.mark.slow
def test_checkpoints_on_gcs_need_gcsfs_which_the_tpu_extra_brings(pod: Path, tmp_path: Path) -> None:
    """fsspec opens gs:// only with gcsfs: the `tpu` extra installs it, and a worker without it refuses a gs://
    checkpoint.url at start-up in one line naming the key, before any training step."""
    import tomllib

    root = Path(__file__).resolve().parent.parent
    extra = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]["tpu"]
    assert any(req.startswith("gcsfs") for req in extra)
    assert importlib.util.find_spec("gcsfs") is None  # the stand-in VMs run this environment: no gcsfs
    handle = launcher().launch(job(tmp_path, "checkpoint.url=gs://bucket/trm"))
    assert handle.wait(300) not in (None, 0)
    log = (tmp_path / "local" / f"{handle.failed_worker}.log").read_text()
    assert any(
        line.startswith("ValueError: checkpoint.url='gs://bucket/trm'") and "gcsfs" in line for line in log.splitlines()
    ), log[-2000:]
    assert not (pod / "test-pod" / "worker-0" / "trm" / "run" / "metrics.jsonl").exists()  # nothing trained


@pytest.mark.slow
def test_a_slot_whose_chips_an_earlier_job_still_holds_takes_no_more_trials(pod: Path) -> None:
    """A job that outlived its stop keeps its chips: the slot is not given to the next trial (which would find
    the TPU busy); a slot of the same VM on other chips is."""
    pods = launcher(slots="chips:2")
    low, high = pods.slots()[:2]  # vm-0/chips-0-1, vm-0/chips-2-3
    assert pods.slot_alive(high)
    vm0 = pod / "test-pod" / "worker-0"
    leftover = subprocess.Popen(  # a training process of this VM's user on chips 2,3
        [sys.executable, "-c", "import time; time.sleep(120)", "-m", "trm.train", "sweep.job=left-over"],
        env={**os.environ, "HOME": str(vm0), "TPU_VISIBLE_CHIPS": "2,3"},
    )
    try:
        assert not pods.slot_alive(high)
        assert pods.slot_alive(low)
    finally:
        leftover.kill()
        leftover.wait()
    assert pods.slot_alive(high)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("slots", "said", "not_said"),
    [("pod", "the study pauses: the job's trial is queued again (no retry spent)", "takes no more trials"),
     ("vm", "this slot takes no more trials; the study goes on", "pauses")],
)  # fmt: skip
def test_a_slot_that_fails_its_check_says_what_the_driver_does_next(
    pod: Path, caplog: pytest.LogCaptureFixture, slots: str, said: str, not_said: str
) -> None:
    """With slots=pod the check's warning said the slot "takes no more trials", though the driver pauses and sets
    the slice up again: it says what happened and what comes next, for each kind of slot."""
    pods = launcher(slots=slots)
    pods.prepare_id = "not-this-one"  # no VM holds it: each reads as recreated without its set-up
    with caplog.at_level("WARNING", logger="sweeps.launchers.tpu.launcher"):
        assert not pods.slot_alive(pods.slots()[0])
    line = next(r.getMessage() for r in caplog.records if "failed its check" in r.getMessage())
    assert "not set up by this study's latest prepare" in line and said in line and not_said not in line
