"""python -m sweeps.preflight against the stand-in pod (tests/fake_gcloud): every worker probed at once, one table,
one line per problem naming the worker and the fix; the driver refuses to start a pod study on a problem."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import trm
from sweeps.config.compose import compose_sweep_config
from sweeps.config.typed_config import typed_sweep
from sweeps.driver import Driver
from sweeps.launchers.torchrun import free_port
from sweeps.preflight import PreflightError, main
from tests.sweep_helpers import FAKE_GCLOUD, FAST_TRIAL, fake_pod, stand_in_pod_overrides, trial_list

pytestmark = pytest.mark.slow  # every test here starts processes or trains

OLD_PYTHON3 = FAKE_GCLOUD.parent / "vm-bin" / "python3"


def pod_args(tmp_path: Path, db: str) -> list[str]:
    """A study on the stand-in pod, its storage the PostgreSQL database `db` (each VM's rank 0 opens it)."""
    return [
        *stand_in_pod_overrides(db, tmp_path / "out", "'~/py'"),
        f"trial.overrides={trial_list([*FAST_TRIAL, 'runtime.backend=torch', f'runtime.port={free_port()}'])}",
        f"preflight.expect={{torch: '{torch.__version__}', torch_xla: null}}",  # this environment's, no torch_xla
        "preflight.chips_glob='~/dev/accel*'",  # the stand-in VMs' chips
        "preflight.min_free_gb=0",
    ]


def give_python(vm: Path, target: Path) -> None:
    """The VM's ~/py: `target` (this environment's interpreter, or the image's old python3)."""
    vm.mkdir(parents=True, exist_ok=True)
    (vm / "py").write_text(f'#!/bin/sh\nexec {target} "$@"\n')
    (vm / "py").chmod(0o755)


def test_preflight_names_the_one_broken_worker_and_the_driver_refuses_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fresh_pg_url: str
) -> None:
    pod = fake_pod(tmp_path, monkeypatch, 2)
    give_python(pod / "test-pod" / "worker-0", Path(sys.executable))
    give_python(pod / "test-pod" / "worker-1", OLD_PYTHON3)  # worker 1 kept the image's Python 3.10
    assert main(pod_args(tmp_path, fresh_pg_url)) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("slice test-pod (v4-16), READY, runtime ")  # as `tpu-vm describe` gives it
    assert out[1].split()[:3] == ["worker", "python", "torch"]
    rows = {line.split()[0]: line for line in out[2:4]}
    assert rows["0"].split()[1] == ".".join(map(str, sys.version_info[:3])) and rows["1"].split()[1] == "3.10.12"
    problems = out[4:]
    assert len(problems) == 1, problems
    assert problems[0].startswith("worker 1: launcher.python='~/py' is Python 3.10.12, older than 3.11: make a")

    # Worker 1 with a Python that passes the launcher's own check, but another version of the trm code.
    stale = tmp_path / "stale-code"
    shutil.copytree(Path(trm.__file__).parent, stale / "trm", ignore=shutil.ignore_patterns("__pycache__"))
    with open(stale / "trm" / "train.py", "a") as f:
        f.write("# an older version\n")
    vm1 = pod / "test-pod" / "worker-1"
    (vm1 / "py").write_text(f'#!/bin/sh\nPYTHONPATH={stale} exec {sys.executable} "$@"\n')
    with pytest.raises(PreflightError) as refused:
        Driver(typed_sweep(compose_sweep_config(pod_args(tmp_path, fresh_pg_url)))).run()
    lines = [line for line in str(refused.value).splitlines() if re.match(r"worker \d+:", line)]
    assert len(lines) == 1 and lines[0].startswith("worker 1: its trm code differs from this checkout's"), lines
    assert "launcher.deploy=true" in lines[0]
    assert "trm.train" not in (pod / "calls.log").read_text()  # no trial started
    # As sweeps.run: its one line and exit 2, as every error the user fixes (it left through Hydra's traceback).
    run = subprocess.run(
        [sys.executable, "-m", "sweeps.run", *pod_args(tmp_path, fresh_pg_url), f"hydra.run.dir={tmp_path}/h"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2 and "error: the machine is not ready" in run.stderr, run.stderr[-2000:]
    assert "Traceback" not in run.stderr

    give_python(vm1, Path(sys.executable))  # fixed: the pod is ready
    assert main(pod_args(tmp_path, fresh_pg_url)) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "no problems: the machine is ready"


def listening(port: int) -> bool:
    """Something accepts connections on the port (a probe that never takes the port itself)."""
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


def test_preflight_sees_a_stale_job_holding_worker_0s_chips_and_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fresh_pg_url: str
) -> None:
    """While a job runs on worker 0 its TPU runtime holds the chips and libtpu's ports: a preflight then says
    so, naming the pids and the port (here the control plane's set to one the runtime holds). The runtime holds a
    port of this test's own: with libtpu's, another test's fake pod may hold it first and free it mid-check."""
    import socket
    import subprocess
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("FAKE_TPU_RUNTIME_PORTS", str(port))
    pod = fake_pod(tmp_path, monkeypatch, 2)
    for w in (0, 1):
        give_python(pod / "test-pod" / f"worker-{w}", Path(sys.executable))
    stale = subprocess.Popen(  # a job left running on worker 0 (a trm.train command line: the runtime comes up)
        [str(FAKE_GCLOUD), "compute", "tpus", "tpu-vm", "ssh", "test-pod", "--zone=z", "--quiet", "--worker=0",
         "--command=exec sleep 60 # trm.train"]
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not listening(port):  # until the runtime holds its port
            time.sleep(0.1)
        args = [a for a in pod_args(tmp_path, fresh_pg_url) if not a.startswith("trial.overrides=")]
        args.append(f"trial.overrides={trial_list([*FAST_TRIAL, f'runtime.port={port}'])}")
        assert main(args) == 1
        problems = capsys.readouterr().out.splitlines()[4:]
        assert any(p.startswith("worker 0: its chips are open in pid(s)") for p in problems), problems
        assert any(p.startswith(f"worker 0: runtime.port={port} cannot be bound") for p in problems), problems
        assert not any(p.startswith("worker 1") for p in problems), problems  # worker 1 is fine
    finally:
        stale.terminate()
        stale.wait()


def test_a_pod_whose_vms_cannot_tell_which_worker_they_are_is_not_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fresh_pg_url: str
) -> None:
    """A TPU VM's ssh session has no TPU_WORKER_ID: the probe asks torch_xla for the TPU's metadata, and where it
    cannot, says so. It used to take worker 0's part on every VM, and the port check passed with no peer seen."""
    pod = fake_pod(tmp_path, monkeypatch, 2)
    monkeypatch.setenv("FAKE_TPU_WORKER_ENV", "0")  # VMs as a real TPU's, without torch_xla here
    for w in (0, 1):
        give_python(pod / "test-pod" / f"worker-{w}", Path(sys.executable))
    assert main(pod_args(tmp_path, fresh_pg_url)) == 1
    problems = capsys.readouterr().out.splitlines()[4:]
    assert [p.split(":")[0] for p in problems] == ["worker 0", "worker 1"], problems
    assert all("cannot tell which worker of the TPU it is" in p for p in problems), problems


def test_worker_0_seeing_fewer_peers_than_reached_it_is_a_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    """Peers that connected to "worker 0" but not to the VM that is: the first host they were given is another."""
    from types import SimpleNamespace

    from sweeps.launchers.tpu.preflight import Answer, problems
    from sweeps.launchers.tpu.slice import SliceShape

    def facts(worker: int, port: dict[str, object]) -> dict[str, object]:
        versions = {"torch_xla": "2.9.0", "libtpu": "0.0.21"}
        return {"worker": worker, "python": "3.11.7", "versions": versions, "code": "c", "chips": [4, []],
                "data": None, "free_gb": 50.0, "checkpoint": None, "port": port}  # fmt: skip

    settings = SimpleNamespace(expect={}, chips_glob="/dev/accel*", min_free_gb=1)
    shape = SliceShape("t", "v4-24", "READY", "", ("a", "b", "c"), 12)
    launcher = SimpleNamespace(python="python3", shape=lambda: shape)
    train = {"runtime": {"port": 12355}, "data": {"path": "data"}}
    answers = [Answer(0, facts(0, {"bind": None, "peers": 1})), *(Answer(w, facts(w, {"reach": None})) for w in (1, 2))]
    monkeypatch.setattr("contracts.code_version.code_fingerprint", lambda: "c")
    sweep = SimpleNamespace(preflight=settings, trial=SimpleNamespace(checkpoint_root=None),
                            wandb=SimpleNamespace(enabled=False))  # fmt: skip
    assert problems(answers, sweep, launcher, train) == [  # type: ignore[arg-type]
        "worker 0: 1 connection(s) on runtime.port=12355, but 2 worker(s) say they reached worker 0 there: they "
        "reached another host (the first of TPU_WORKER_HOSTNAMES or of the TPU's metadata is not this VM)"
    ]
    answers[0].facts["port"] = {"bind": None, "peers": 2}  # type: ignore[index]
    assert problems(answers, sweep, launcher, train) == []  # type: ignore[arg-type]


def test_rank_0_needs_its_own_credentials_on_the_vm_where_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fresh_pg_url: str
) -> None:
    """gcloud's ssh carries none of the driver's environment: a password variable or a W&B key set only here would
    leave a trial's rank 0 unable to report to the study, or logging offline on its VM's disk. The probe opens the
    storage and resolves W&B as the job does, on every VM where a rank 0 runs (slots=pod: worker 0; vm: each)."""
    pod = fake_pod(tmp_path, monkeypatch, 2)
    for w in (0, 1):
        give_python(pod / "test-pod" / f"worker-{w}", Path(sys.executable))
    # This server trusts any password: what is missing on the VMs is the variable.
    monkeypatch.setenv("TRM_TEST_DB_PW", "db-secret-7f3a")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)  # this machine logs online
    monkeypatch.delenv("WANDB_MODE", raising=False)
    args = [*pod_args(tmp_path, fresh_pg_url), "wandb.mode=auto"]

    def problems_of(*extra: str) -> list[str]:
        code = main([*args, *extra])
        found = capsys.readouterr().out.splitlines()[4:]
        assert code == (1 if found != ["no problems: the machine is ready"] else 0), found
        return found

    found = problems_of("storage.password_env=TRM_TEST_DB_PW")
    assert [p.split(":")[0] for p in found] == ["worker 0", "worker 0"], found  # worker 1 runs no rank 0
    assert found[0].startswith(
        "worker 0: rank 0 cannot open the study storage there (storage.password_env = 'TRM_TEST_DB_PW' names an "
        "environment variable that is not set or empty;"
    )
    assert "gcloud's ssh carries none of this machine's credentials: give each VM the password in its own" in found[0]
    assert found[1].startswith("worker 0: W&B would log offline there (no WANDB_API_KEY, no `wandb login`)")
    assert "db-secret-7f3a" not in " ".join(found)

    # The fixes the lines give: the password from each VM's ~/.pgpass (this server asks for none), and worker 0
    # ran `wandb login` (its ~/.netrc).
    netrc = pod / "test-pod" / "worker-0" / ".netrc"
    netrc.write_text(f"machine api.wandb.ai\n  login user\n  password {'k' * 40}\n")
    assert problems_of() == ["no problems: the machine is ready"]
    # What the launcher exports in front of the job counts: here it turns W&B off on the VMs.
    found = problems_of("+launcher.env.WANDB_MODE=disabled")
    assert found == [
        "worker 0: W&B would log disabled there (its WANDB_MODE says disabled) while this machine logs online, so "
        "the trials' runs would not reach W&B; gcloud's ssh carries none of this machine's credentials: run `wandb "
        "login` on every VM, or set wandb.mode=disabled"
    ]
    # A trial per VM: worker 1 runs a rank 0 too, and has not logged in to W&B.
    found = problems_of("launcher.slots=vm")
    assert len(found) == 1 and found[0].startswith("worker 1: W&B would log offline there"), found
    # A storage the VMs cannot reach.
    found = problems_of(f"storage.url=postgresql://postgres@127.0.0.1:{free_port()}/nowhere")
    assert len(found) == 1 and found[0].startswith("worker 0: rank 0 cannot open the study storage there (cannot "
                                                   "open storage postgresql://postgres@127.0.0.1:"), found  # fmt: skip


def test_the_preflight_refuses_a_sqlite_study_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fresh_pg_url: str
) -> None:
    fake_pod(tmp_path, monkeypatch, 2)
    db = tmp_path / "optuna.db"
    assert main([*pod_args(tmp_path, fresh_pg_url), "storage=sqlite", f"storage.url=sqlite:///{db}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"storage.url='sqlite:///{db}': a SQLite file on this machine, but TpuPodLauncher's"), err


def test_each_way_w_and_b_would_differ_on_a_vm_is_named() -> None:
    """Online here and offline there, by a missing key or by the VM's own WANDB_MODE; online without a key."""
    from types import SimpleNamespace

    from sweeps.launchers.tpu.preflight import _rank0_problems

    sweep = SimpleNamespace()

    def line(mode: str, key: bool, here: str | None) -> list[str]:
        return _rank0_problems(3, {"storage": None, "wandb": {"mode": mode, "key": key}}, sweep, here)  # type: ignore[arg-type]

    assert line("offline", False, "online")[0].startswith(
        "worker 3: W&B would log offline there (no WANDB_API_KEY, no `wandb login`) while this machine logs online"
    )
    assert "(its WANDB_MODE says offline)" in line("offline", True, "online")[0]
    assert line("disabled", True, "online")[0].startswith("worker 3: W&B would log disabled there (its WANDB_MODE says")
    assert line("online", False, "offline")[0].startswith(
        "worker 3: W&B finds no API key there, so rank 0's wandb.init fails in mode online"
    )
    assert line("offline", False, "offline") == line("online", True, "online") == line("offline", False, None) == []
