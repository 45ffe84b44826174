"""W&B tracking on rank 0: real sweep trials and torchrun jobs, their offline runs read back from disk."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState, create_trial

from contracts.hydra_app import TrainJob, compose_train_config
from contracts.run_summary import RunSummary
from contracts.wandb_runs import (
    DEFAULT_HOST,
    api_key_found,
    resolve_mode,
    summary_run_id,
    trial_run_id,
    wandb_host,
)
from storage import redact
from storage.study_record import StudyAttrs
from sweeps.config.typed_config import typed_sweep
from sweeps.driver import Driver
from sweeps.launchers.torchrun import free_port
from sweeps.trials.wandb_summary import log_study_summary, trial_wandb_overrides
from tests.sweep_helpers import FAST_TRIAL, sweep_config, trial_dir
from tests.wandb_offline import find_runs, read_offline_run
from trm.tracking import tracker as tracker_module
from trm.tracking.tracker import Tracker, WandbTracker, make_tracker

ROOT = Path(__file__).resolve().parents[1]
PASSWORD_ENV = "TRM_TEST_WANDB_DB_PASSWORD"
# Log every 5 steps and eval every 10, so train and eval points differ.
TRIAL = [o if not o.startswith("train.log_interval=") else "train.log_interval=5" for o in FAST_TRIAL]
# The halting study's baseline (its first, enqueued trial) on the fast trial settings.
HALTING_BASELINE = {"arch.halt_max_steps": 4, "halting.exploration_prob": 0.1, "halting.adaptive": False}


@pytest.fixture
def offline_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No API key and no WANDB_MODE: what a machine without W&B credentials sees (mode auto -> offline)."""
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(var, raising=False)


def metrics_jsonl(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_sweep_trial_logs_one_offline_run_with_config_metrics_and_summary(
    pg_url: str, tmp_path: Path, offline_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = f"pw-{secrets.token_hex(8)}"  # the server trusts us; the job still reads and uses this password
    monkeypatch.setenv(PASSWORD_ENV, secret)
    data_dir = tmp_path / "data"
    monkeypatch.setenv("TRM_DATA_DIR", str(data_dir))
    cfg = sweep_config(
        pg_url,
        tmp_path,
        "study=halting",
        "study.name=wandb_halting",
        "wandb.enabled=true",  # sweep_overrides turns W&B off: this test reads its files
        "n_trials=1",
        f"storage.password_env={PASSWORD_ENV}",
        trial=TRIAL,
    )
    study = Driver(typed_sweep(cfg)).run()
    trial = study.trials[0]
    assert trial.state.name == "COMPLETE", trial.user_attrs

    run_root = trial_dir(tmp_path / "wandb_halting", 0) / "run"
    all_runs = find_runs(tmp_path)
    runs = [p for p in all_runs if run_root / "wandb" in p.parents]
    assert len(runs) == 1, all_runs  # one run for the trial (plus the driver's study summary, checked below)
    assert runs[0].name.startswith("offline-run-")  # no API key: nothing went to the network
    run = read_offline_run(runs[0])

    # Identity: the run id is the trial's (study uid, retry chain 0, seed 0), so a retry would continue this run
    uid = StudyAttrs.of(study.user_attrs).uid
    assert run.run_id == trial_run_id(uid, 0, 0) == f"{uid[:12]}-t0-s0"
    assert (run.project, run.group, run.name, run.job_type) == (
        "trm-sweeps",
        "wandb_halting",
        "wandb_halting-0",
        "trial",
    )
    assert {"study:wandb_halting", "sampler:TPESampler", "pruner:EvidencePruner", "launcher:LocalLauncher"} <= set(
        run.tags
    )

    # Config: the sampled parameters, the resolved training config, no secret and no env value
    assert run.config["trial_params"] == HALTING_BASELINE
    assert run.config["arch"]["halt_max_steps"] == 4 and run.config["arch"]["hidden_size"] == 16
    assert run.config["train"]["log_interval"] == 5
    assert run.config["sweep"]["study"] == "wandb_halting" and run.config["sweep"]["trial_number"] == 0
    assert run.config["sweep"]["storage"] == redact(pg_url)
    assert run.config["sweep"]["password_env"] == PASSWORD_ENV
    assert run.config["data"]["root"] == "<env:TRM_DATA_DIR>"
    assert str(data_dir) not in json.dumps(run.config)
    assert run.config["model"]["params"] == trial.user_attrs["params_count"]
    for path in runs[0].rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"the database password leaked into {path}"

    # Metrics at the training steps where the job logged them (same values as its metrics.jsonl)
    records = metrics_jsonl(run_root)
    expected_train = {r["step"]: r["train/lm_loss"] for r in records if "train/lm_loss" in r}
    expected_eval = {r["step"]: r["eval/exact_accuracy"] for r in records if "eval/exact_accuracy" in r}
    assert sorted(expected_train) == [5, 10, 15, 20] and sorted(expected_eval) == [10, 20]
    assert run.series("train/lm_loss") == pytest.approx(expected_train)
    assert run.series("eval/exact_accuracy") == pytest.approx(expected_eval)
    assert sorted(run.series("eval/lm_loss")) == [10, 20]

    # Summary: the outcome the trial got, and what the driver reads from the trial
    attrs = trial.user_attrs
    assert run.summary["outcome"] == "COMPLETE" == attrs["outcome"]
    assert run.summary["best_step"] == attrs["best_step"] and run.summary["best_step"] in (10, 20)
    assert run.summary["best_value"] == pytest.approx(attrs["best_value"])
    assert run.summary["objective"] == cfg.study.objective == "eval/exact_accuracy"
    assert run.summary["params"] == attrs["params_count"] > 0
    assert run.summary["compute_flops"] == attrs["compute_flops"] > 0
    assert run.summary["steps"] == 20 and run.exit_code == 0
    speed = attrs["details"]["throughput"]  # the step speed the trial stores, flat in the run's summary
    assert run.summary["throughput/samples_per_s"] == pytest.approx(speed["samples_per_s"]) and speed["steps"] == 15

    # The study-summary run the driver logged at the end: one row per trial
    summary_dirs = [p for p in all_runs if p not in runs]
    assert len(summary_dirs) == 1, all_runs
    summary_dir = summary_dirs[0]
    assert (tmp_path / "wandb_halting" / "wandb") in summary_dir.parents
    summary_run = read_offline_run(summary_dir)
    assert (summary_run.group, summary_run.job_type, summary_run.name) == (
        "wandb_halting",
        "study-summary",
        "wandb_halting-summary",
    )
    assert summary_run.run_id == summary_run_id(uid)
    assert summary_run.summary["best/number"] == 0 and summary_run.summary["count/complete"] == 1
    table_ref = summary_run.summary["trials"]
    assert table_ref["_type"] == "table-file"
    table = json.loads((summary_dir / "files" / table_ref["path"]).read_text())
    row = dict(zip(table["columns"], table["data"][0]))
    assert row["number"] == 0 and row["state"] == "COMPLETE" and row["value"] == pytest.approx(trial.value)
    assert row["best_step"] == attrs["best_step"] and row["param/arch.halt_max_steps"] == 4
    assert row["samples_per_s"] == pytest.approx(speed["samples_per_s"])  # comparable across studies in W&B
    assert json.loads(row["params"]) == trial.params


@pytest.mark.slow
def test_two_process_torchrun_job_creates_exactly_one_run(tmp_path: Path, offline_env: None) -> None:
    out, cwd = tmp_path / "out", tmp_path / "cwd"
    cwd.mkdir()
    overrides = [*TRIAL, f"out_dir={out}", f"data.root={tmp_path / 'data'}"]
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2", "--master_addr=127.0.0.1",
            f"--master_port={free_port()}", "-m", "trm.train", *overrides]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["rank_steps"] == [20, 20]  # really two ranks

    runs = find_runs(tmp_path)  # anywhere: the job's out_dir, the cwd, ...
    assert len(runs) == 1 and (out / "wandb") in runs[0].parents, runs
    run = read_offline_run(runs[0])
    assert (run.group, run.name, run.job_type) == ("manual", "manual-out", "train")
    assert run.config["trial_params"] == {} and "sweep" in run.config
    assert sorted(run.series("train/lm_loss")) == [5, 10, 15, 20]
    assert run.summary["outcome"] == "COMPLETE" and run.summary["steps"] == 20


def test_mode_is_offline_unless_an_api_key_is_set() -> None:
    assert resolve_mode("auto", {}) == "offline"
    assert resolve_mode("auto", {"WANDB_API_KEY": "k"}) == "online"
    assert resolve_mode("auto", {"WANDB_API_KEY": "k", "WANDB_MODE": "offline"}) == "offline"
    assert resolve_mode("auto", {"WANDB_MODE": "disabled"}) == "disabled"
    assert resolve_mode("offline", {"WANDB_API_KEY": "k"}) == "offline"
    with pytest.raises(ValueError, match=r"wandb.mode='cloud'"):
        resolve_mode("cloud", {})


def test_a_wandb_login_key_counts_as_a_key_as_wandb_itself_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`wandb login` keeps the key in ~/.netrc, not in the environment (a TPU VM's ssh session has none): `auto`
    finds it where W&B's own reader does, for W&B's server or the one WANDB_BASE_URL names, and nowhere else."""
    from wandb.sdk.lib.wbauth import read_netrc_auth, write_netrc_auth

    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    environ = {"HOME": str(tmp_path)}
    assert not api_key_found(environ) and read_netrc_auth(host=DEFAULT_HOST) is None
    write_netrc_auth(host=DEFAULT_HOST, api_key="a" * 40)  # what `wandb login` does
    assert read_netrc_auth(host=DEFAULT_HOST) == "a" * 40
    assert api_key_found(environ) and resolve_mode("auto", environ) == "online"
    assert resolve_mode("auto", {**environ, "WANDB_MODE": "offline"}) == "offline"
    other = "https://wandb.example.org"
    assert read_netrc_auth(host=other) is None
    assert not api_key_found({**environ, "WANDB_BASE_URL": other})
    write_netrc_auth(host=other, api_key="b" * 40)
    assert read_netrc_auth(host=other) == "b" * 40 and api_key_found({**environ, "WANDB_BASE_URL": other})
    moved = tmp_path / "elsewhere"
    (tmp_path / ".netrc").rename(moved)
    monkeypatch.setenv("NETRC", str(moved))
    assert read_netrc_auth(host=DEFAULT_HOST) == "a" * 40
    assert not api_key_found(environ) and api_key_found({**environ, "NETRC": str(moved)})

    # `wandb login --host` keeps the server in W&B's global settings file: that server's key counts, as W&B reads it.
    from wandb.sdk.lib.settings_file import SettingsFiles

    self_hosted = "https://wandb.internal.example"
    files = SettingsFiles(global_settings=tmp_path / ".config" / "wandb" / "settings", local_settings=tmp_path / "ws")
    files.set("base_url", self_hosted, globally=True)
    files.save()
    environ = {"HOME": str(tmp_path), "NETRC": str(moved)}
    again = SettingsFiles(global_settings=tmp_path / ".config" / "wandb" / "settings", local_settings=tmp_path / "ws")
    assert wandb_host(environ) == self_hosted == again.all()["base_url"]  # what W&B reads back
    assert not api_key_found(environ)  # the cloud key is not that server's
    write_netrc_auth(host=self_hosted, api_key="c" * 40)
    assert api_key_found(environ)
    assert wandb_host({**environ, "WANDB_BASE_URL": other}) == other  # the variable wins, as in W&B
    assert wandb_host({"HOME": str(tmp_path), "WANDB_CONFIG_DIR": str(tmp_path / "none")}) == DEFAULT_HOST


def test_tracking_failure_is_one_warning_and_a_no_op(
    tmp_path: Path, offline_env: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(tracker_module, "_warned", False)
    # wandb itself rejects the console setting: init fails, training goes on untracked
    cfg = compose_train_config([f"out_dir={tmp_path}", "wandb.console=bogus"])
    tracker = make_tracker(TrainJob.of(cfg), is_main=True, extra={"params": 1})
    assert type(tracker) is Tracker
    tracker.log(5, {"train/lm_loss": 1.0})
    tracker.close(RunSummary(outcome="COMPLETE"))
    err = capsys.readouterr().err
    assert err.count("warning: W&B tracking is off") == 1 and "console" in err
    assert not find_runs(tmp_path)
    # Not rank 0, or disabled: no run either, and no warning
    assert type(make_tracker(TrainJob.of(compose_train_config([f"out_dir={tmp_path}"])), is_main=False)) is Tracker
    assert (
        type(
            make_tracker(
                TrainJob.of(compose_train_config([f"out_dir={tmp_path}", "wandb.enabled=false"])), is_main=True
            )
        )
        is Tracker
    )
    assert capsys.readouterr().err == "" and not find_runs(tmp_path)


@pytest.mark.slow
def test_a_retry_logs_only_the_steps_its_chain_has_not(tmp_path: Path, offline_env: None) -> None:
    """Offline, every job of a retry chain writes its own file of the chain's run, and `wandb sync` uploads them
    one after another: the steps a retry repeats after its checkpoint would be in the run twice."""
    cfg = compose_train_config([f"out_dir={tmp_path}", "wandb.run_id=abc-t0-s0", "wandb.logged_through_step=20"])
    tracker = make_tracker(TrainJob.of(cfg), is_main=True)
    for step in (10, 20, 30):
        tracker.log(step, {"train/lm_loss": float(step)})
    tracker.close(RunSummary(outcome="COMPLETE", steps=30, best_step=None, final={}))
    assert read_offline_run(find_runs(tmp_path)[0]).series("train/lm_loss") == {30: 30.0}


@pytest.mark.slow
def test_a_failing_run_is_recorded_as_fail(tmp_path: Path, offline_env: None) -> None:
    cfg = compose_train_config([f"out_dir={tmp_path}", "wandb.project=p-fail", "wandb.tags=[extra]"])
    tracker = make_tracker(TrainJob.of(cfg), is_main=True, extra={"params": 7})
    assert isinstance(tracker, WandbTracker)
    tracker.log(3, {"train/lm_loss": 2.5, "train/lr": 0.1})
    tracker.close(RunSummary(outcome="FAIL", error="NonFiniteLossError: non-finite loss at step 3", steps=3, final={}))
    run = read_offline_run(find_runs(tmp_path)[0])
    assert run.project == "p-fail" and run.tags == ["extra"] and run.config["model"] == {"params": 7}
    assert run.summary["outcome"] == "FAIL" and "non-finite" in run.summary["error"] and run.exit_code == 1
    assert run.series("train/lm_loss") == {3: 2.5}


def test_sweep_wandb_block_becomes_trial_overrides(tmp_path: Path) -> None:
    cfg = sweep_config(
        f"sqlite:///{tmp_path}/db.sqlite",
        tmp_path,
        "wandb.enabled=true",
        "wandb.project=trm-x",
        "wandb.mode=offline",
        "wandb.tags=[a,b]",
    )
    overrides = trial_wandb_overrides(typed_sweep(cfg).wandb)
    assert overrides == [
        "wandb.init_timeout_s=60",
        "wandb.finish_timeout_s=300",
        "wandb.mode=offline",
        "wandb.project=trm-x",
        "wandb.tags=['a','b']",
    ]
    train = compose_train_config(overrides)  # they are valid training overrides
    assert train.wandb.project == "trm-x" and list(train.wandb.tags) == ["a", "b"] and train.wandb.mode == "offline"


# ------------------------------------------------------------------------------------------ run ids


def test_run_ids_are_deterministic_per_study_retry_chain_and_seed() -> None:
    uid, other = "0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"
    assert trial_run_id(uid, 3, 1) == trial_run_id(uid, 3, 1) == "0123456789ab-t3-s1"
    ids = {
        trial_run_id(uid, 3, 0),
        trial_run_id(uid, 3, 1),
        trial_run_id(uid, 4, 0),
        trial_run_id(other, 3, 0),
        summary_run_id(uid),
        summary_run_id(other),
    }
    assert len(ids) == 6  # another seed, retry chain or study: another run
    assert summary_run_id(uid) == summary_run_id(uid) == "0123456789ab-summary"
    for run_id in ids:  # what W&B accepts as an id
        assert len(run_id) <= 64 and re.fullmatch(r"[0-9a-z-]+", run_id)


def test_the_driver_gives_every_attempt_of_a_trial_its_chains_run_id(tmp_path: Path) -> None:
    """A retry (a new trial number resuming its chain's checkpoint) gets the run id of the chain's first attempt."""
    cfg = sweep_config(f"sqlite:///{tmp_path}/db.sqlite", tmp_path, "wandb.enabled=true")
    runner = Driver(typed_sweep(cfg)).runner(study_uid="abcdef0123456789abcdef0123456789")
    first = runner.jobs.job_command(3, {}, origin=3).overrides()
    retry = runner.jobs.job_command(7, {}, origin=3).overrides()
    seed1 = runner.jobs.job_command(7, {}, origin=3, seed_index=1).overrides()
    ids = [[o for o in overrides if o.startswith("wandb.run_id=")] for overrides in (first, retry, seed1)]
    assert ids == [
        ["wandb.run_id=abcdef012345-t3-s0"],
        ["wandb.run_id=abcdef012345-t3-s0"],
        ["wandb.run_id=abcdef012345-t3-s1"],
    ]
    assert (
        compose_train_config([o for o in seed1 if o.startswith("wandb.")]).wandb.run_id == "abcdef012345-t3-s1"
    )  # a valid override
    # A retry's job also gets the last step its chain's earlier jobs logged to that run.
    assert not any(o.startswith("wandb.logged_through_step=") for o in first)
    later = runner.jobs.job_command(7, {}, origin=3, logged_through=40).overrides()
    assert "wandb.logged_through_step=40" in later
    assert compose_train_config([o for o in later if o.startswith("wandb.")]).wandb.logged_through_step == 40


def test_a_retry_is_told_the_last_step_its_chain_logged(tmp_path: Path) -> None:
    """The chain's earlier attempts' progress (their last log point, where they also logged to W&B), the latest of
    them: a retry that died before passing its predecessor does not lower it."""
    from optuna.distributions import FloatDistribution

    from storage.heartbeat import retry_history
    from storage.record import PROGRESS_ATTR

    driver = Driver(typed_sweep(sweep_config(f"sqlite:///{tmp_path}/db.sqlite", tmp_path, "wandb.enabled=true")))
    study = driver.open_study()
    dist = {"x": FloatDistribution(0, 1)}

    def attempt(progress: int | None, history: list[int]) -> FrozenTrial:
        attrs = {PROGRESS_ATTR: {"step": progress, "at": 0.0}, "seed1/" + PROGRESS_ATTR: {"step": 7, "at": 0.0}}
        system = {"failed_trial": history[-1], "retry_history": history} if history else {}
        state = TrialState.FAIL if progress is not None else TrialState.WAITING
        study.add_trial(create_trial(state=state, params={"x": 0.5}, distributions=dist,
                                     user_attrs=attrs if progress is not None else {}, system_attrs=system))  # fmt: skip
        return study.trials[-1]

    first = attempt(40, [])
    assert driver.trials.chain_logged_through(retry_history(first)) is None  # no earlier job
    attempt(20, [first.number])  # the retry resumed from an earlier checkpoint and died at step 20
    third = attempt(None, [first.number, first.number + 1])
    assert driver.trials.chain_logged_through(retry_history(third)) == 40
    assert driver.trials.chain_logged_through(retry_history(third), seed_index=1) == 7
    off = Driver(typed_sweep(sweep_config(f"sqlite:///{tmp_path}/db.sqlite", tmp_path, "wandb.enabled=false")))
    assert not [o for o in off.trials.jobs.job_command(0, {}, origin=0).overrides() if o.startswith("wandb.run_id")]


@pytest.mark.slow
def test_a_resumed_job_writes_to_the_same_run_id(tmp_path: Path, offline_env: None) -> None:
    """Two starts of one job (preempted, then resumed from its checkpoint) with the run id the driver passes: one
    W&B run. Offline, each start writes its own directory under that id; `wandb sync` uploads them into one run."""
    run_id = trial_run_id("0123456789abcdef", 5, 0)
    cfg = compose_train_config([f"out_dir={tmp_path / 'job'}", f"wandb.run_id={run_id}"])
    for step, outcome in ((10, "PREEMPTED"), (20, "COMPLETE")):
        tracker = make_tracker(TrainJob.of(cfg), is_main=True, extra={"params": 1})
        assert isinstance(tracker, WandbTracker)
        tracker.log(step, {"train/lm_loss": 1.0 / step})
        tracker.close(RunSummary(outcome=outcome, steps=step))
    runs = [read_offline_run(p) for p in find_runs(tmp_path / "job")]
    assert [r.run_id for r in runs] == [run_id, run_id]
    assert [sorted(r.series("train/lm_loss")) for r in runs] == [[10], [20]] and runs[1].summary[
        "outcome"
    ] == "COMPLETE"
    # Without an id W&B draws a new one each time: two runs.
    plain = compose_train_config([f"out_dir={tmp_path / 'plain'}"])
    for _ in range(2):
        make_tracker(TrainJob.of(plain), is_main=True).close(RunSummary(outcome="COMPLETE"))
    plain_ids = [read_offline_run(p).run_id for p in find_runs(tmp_path / "plain")]
    assert len(set(plain_ids)) == 2 and run_id not in plain_ids


@pytest.mark.slow
def test_a_restarted_driver_updates_the_one_study_summary_run(tmp_path: Path, offline_env: None) -> None:
    storage = f"sqlite:///{tmp_path}/db.sqlite"
    sweep = typed_sweep(sweep_config(storage, tmp_path, "study.name=summary_twice", "wandb.enabled=true"))
    study = optuna.create_study(study_name="summary_twice", storage=storage, direction="maximize")
    uid = "feedfacefeedfacefeedfacefeedface"
    StudyAttrs(uid=uid).store(study.set_user_attr)
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=0.25))
    first = log_study_summary(study, sweep)
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=0.75))  # the next driver start ran another trial
    second = log_study_summary(study, sweep)
    assert first and second and first != second  # offline: one directory per driver start ...
    runs = [read_offline_run(p) for p in find_runs(tmp_path)]
    assert [r.run_id for r in runs] == [summary_run_id(uid)] * 2  # ... of one run, which the second updates
    assert [(r.summary["count/complete"], r.summary["best/number"]) for r in runs] == [(1, 0), (2, 1)]


@pytest.mark.slow
def test_finishing_one_run_leaves_another_active_run_of_the_process_logging(
    tmp_path: Path, offline_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """finish_run stops W&B's service only when no run of the process is still active. Runs made with
    reinit="create_new" never become `wandb.run`, which it used to ask: it stopped the service under the other."""
    import wandb

    from contracts.wandb_runs import finish_run, run_settings

    monkeypatch.setenv("WANDB_MODE", "offline")
    settings = run_settings(init_timeout_s=60, finish_timeout_s=30)
    first, second = (
        wandb.init(project="p", id=name, dir=str(tmp_path / name), reinit="create_new", settings=settings)
        for name in ("first", "second")
    )
    first.log({"x": 1.0}, step=1)
    finish_run(first)
    second.log({"x": 2.0}, step=2)
    finish_run(second)
    (one,) = find_runs(tmp_path / "first")
    (two,) = find_runs(tmp_path / "second")
    assert read_offline_run(one).series("x") == {1: 1.0}
    assert read_offline_run(two).series("x") == {2: 2.0} and read_offline_run(two).exit_code == 0


def test_a_jobs_trial_params_come_from_its_own_command_line() -> None:
    """The driver names the sampled keys on the job's command line (sweep.sampled); the job's W&B run takes their
    values from its own overrides, as Hydra read them, not from the database (a later fixed override of another
    key, and keys nobody sampled, stay out)."""
    from sweeps.launchers.job_command import StudyLink
    from trm.tracking.run_config import sampled_params

    link = StudyLink("s", "0123456789ab", 3, "sqlite:///x.db", sampled=("arch.hidden_size", "optim"))
    assert "sweep.sampled=[arch.hidden_size,optim]" in link.overrides()
    overrides = ["out_dir=/tmp/o", "arch.hidden_size=32", "optim=lion", *link.overrides()]
    job = TrainJob.of(compose_train_config(overrides), tuple(overrides))
    assert job.app.sweep.sampled == ["arch.hidden_size", "optim"]
    assert sampled_params(job) == {"arch.hidden_size": 32, "optim": "lion"}
    plain = ["out_dir=/tmp/o", "arch.hidden_size=32"]
    assert sampled_params(TrainJob.of(compose_train_config(plain), tuple(plain))) == {}
