"""The tpu_pod launcher against a stand-in `gcloud` (tests/fake_gcloud): every worker VM a real process in
its own directory and HOME, with the environment a TPU VM gives, the gloo control plane on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from sweeps.config import compose_sweep_config
from sweeps.driver import Driver
from sweeps.launchers.base import JobSpec
from sweeps.launchers.torchrun import free_port
from sweeps.launchers.tpu_pod import TpuPodLauncher
from tests.sweep_helpers import FAST_TRIAL, fake_pod, trial_dir, trial_list

FAKE_GCLOUD = Path(__file__).parent / "fake_gcloud" / "gcloud"
NOTE = """a b "c" [e,f] $HOME `x` ; end"""  # spaces, quotes, brackets, $, backticks: must arrive unchanged


@pytest.fixture
def pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return fake_pod(tmp_path, monkeypatch, 2)


def training_processes() -> dict[str, str]:
    """{TPU_WORKER_ID: pid} of the fake VMs' training processes (not the local gcloud clients)."""
    found = {}
    for pid in subprocess.run(["pgrep", "-f", "[s]weep.job=pod-job-1"], capture_output=True, text=True).stdout.split():
        try:
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
        num_workers=2,
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
    assert handle.wait(90) not in (None, 0)
    assert time.monotonic() - killed_at < 60
    print(f"[fault] SIGKILL of a pod worker: job ended {time.monotonic() - killed_at:.1f} s later")
    assert handle.failed_worker == "worker-1"
    time.sleep(1)
    assert not training_processes()  # the remote pkill stopped worker 0's training too, not only the local ssh


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


def test_a_study_on_the_fake_pod(pod: Path, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/optuna.db"
    cfg = compose_sweep_config(
        [
            "site=pod",
            "launcher.tpu_name=test-pod",
            "launcher.zone=us-central2-b",
            f"launcher.gcloud={FAKE_GCLOUD}",
            f"launcher.python={sys.executable}",
            "launcher.num_workers=2",
            "launcher.remote_dir='~/trm'",
            "launcher.env={}",
            "storage=sqlite",
            f"storage.url={db}",
            f"output_root={tmp_path}/out",
            "study=halting",
            "n_trials=1",
            "pruner=none",
            f"trial.overrides={trial_list([*FAST_TRIAL, 'runtime.backend=torch', f'runtime.port={free_port()}'])}",
            "heartbeat.interval_s=1",
            "poll_s=0.2",
        ]
    )
    Driver(cfg).run()
    trial = optuna.load_study(study_name="halting", storage=db).trials[0]
    assert trial.state == TrialState.COMPLETE, trial.user_attrs
    ckpt = trial_dir(pod / "test-pod" / "worker-0" / "trm" / "runs" / "halting", 0) / "checkpoints" / "latest.pt"
    assert ckpt.exists()  # on worker 0's own disk, where its retry would find it


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
    for vm in vms:
        subprocess.run([sys.executable, "-m", "venv", str(vm / "venv")], check=True)
    launcher(deploy=True, wheel=str(wheel), python="$HOME/venv/bin/python").prepare()
    for vm in vms:
        assert (vm / "trm" / wheel.name).is_file()
        shown = subprocess.run(
            [str(vm / "venv" / "bin" / "python"), "-m", "pip", "show", "-f", "trm-sweeps"],
            capture_output=True,
            text=True,
        )
        assert shown.returncode == 0 and "trm_sweeps_conf/study/model_scaling.yaml" in shown.stdout


def test_deploy_from_an_installed_copy_asks_for_the_wheel(
    pod: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An installed trm-sweeps has no checkout to build a wheel from: refused before any VM is contacted, naming
    launcher.wheel; a launcher.wheel that is not a wheel file is refused too."""
    from sweeps.launchers import tpu_pod
    from sweeps.launchers.base import LauncherConfigError

    monkeypatch.setattr(tpu_pod, "CHECKOUT", tmp_path / "site-packages")
    with pytest.raises(LauncherConfigError, match=r"set launcher.wheel=/path/to/trm_sweeps-<version>.whl"):
        launcher(deploy=True).validate()
    with pytest.raises(LauncherConfigError, match=r"launcher.wheel='.*nothing.whl': not a wheel file"):
        launcher(deploy=True, wheel=str(tmp_path / "nothing.whl")).validate()
    launcher(deploy=False).validate()  # nothing to deploy: nothing to build
    assert not (pod / "calls.log").exists()


def test_the_legacy_xla_dist_launcher_is_gone() -> None:
    """launcher=xla_dist drove torch_xla < 2.1, whose runtime trm/runtime/xla.py cannot run on: removed, so the
    launcher group offers only launchers that can train here (Hydra names the ones it has)."""
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException, match=r"launcher/xla_dist"):
        compose_sweep_config(["launcher=xla_dist"])
