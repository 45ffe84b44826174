"""Sweeps end to end against the real PostgreSQL: studies, distributed trials, pruning, recovery."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import pytest
from omegaconf import MissingMandatoryValue, open_dict
from optuna.trial import TrialState

from storage import open_storage
from sweeps.config.compose import compose_sweep_config
from sweeps.config.typed_config import typed_sweep
from sweeps.driver import Driver
from sweeps.launchers.base import LauncherConfigError
from sweeps.run import dry_run
from sweeps.search.space import SearchSpaceError
from sweeps.search.study import StudyMismatchError
from sweeps.validation.validate import SweepConfigError
from tests.sweep_helpers import (
    FAST_TRIAL,
    fake_pod,
    summary_of,
    sweep_config,
    sweep_overrides,
    trial_dir,
    trial_file_exists,
)

STUDIES = ["model_scaling", "model_scaling_pareto", "curriculum", "halting", "optimizer"]
FAKE_GCLOUD = Path(__file__).parent / "fake_gcloud" / "gcloud"
POD = ["site=pod", "launcher.tpu_name=test-pod", "launcher.zone=us-central2-b"]


def load(pg_url: str, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=open_storage(pg_url))


# ------------------------------------------------------------------------------- validation, dry run


@pytest.mark.slow
@pytest.mark.parametrize("site", ["laptop", "pod"])
@pytest.mark.parametrize("study", STUDIES)
def test_every_study_validates_and_dry_runs(
    study: str, site: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    priced = site == "pod" and study == "model_scaling"  # the cost estimate starts trm.info: once here
    extra = [f"study={study}", "n_trials=3", f"estimate.enabled={str(priced).lower()}", *(POD if site == "pod" else [])]
    if site == "pod":  # the pod site brings its own trial overrides (paper scale); its size from the stand-in's slice
        fake_pod(tmp_path, monkeypatch, 8)
        cfg = compose_sweep_config([f"output_root={tmp_path}", f"launcher.gcloud={FAKE_GCLOUD}", *extra])
    else:
        cfg = sweep_config(f"sqlite:///{tmp_path}/db.sqlite", tmp_path, *extra)
    driver = Driver(typed_sweep(cfg))
    driver.validate()
    dry_run(driver)
    out = capsys.readouterr().out
    assert out.count("trm.train") == 3
    assert "trial 2:" in out
    if site == "pod":
        assert (
            "gcloud compute tpus tpu-vm ssh test-pod --zone=us-central2-b" in out and "experiment=paper_sudoku" in out
        )
    if priced:  # every trial priced from its measured FLOPs: v4-64 has 8x the chips of v4-8
        costs = [line for line in out.splitlines() if line.strip().startswith("cost:")]
        assert len(costs) == 3 and all(
            "GFLOP/sample-step" in c and "v4-64" in c and "batch 768 x 65104 steps" in c for c in costs
        )
        assert "ms/step" in costs[0] and "# study cost: 3 trials, none pruned: v4-8 " in out
    assert not (tmp_path / "db.sqlite").exists()  # a dry run stores nothing


def with_space(cfg, space: dict, conditional: dict | None = None):
    """Replace the tiny-scale search space of a composed sweep config (keys contain dots, so not via CLI)."""
    with open_dict(cfg):
        cfg.study.space.tiny = space
        cfg.study.conditional.tiny = conditional or {}
    return cfg


@pytest.mark.parametrize(
    "space,conditional,error,expected",
    [
        ({"arch.hidden_size": "interval(64, 32)"}, None, SearchSpaceError, r"'arch.hidden_size'.*interval\(64, 32\)"),
        ({"optim.lr": "tag(log, interval(0, 0.1))"}, None, SearchSpaceError, r"'optim.lr'.*low > 0"),
        ({"arch.mixer": "choice()"}, None, SearchSpaceError, r"'arch.mixer'.*empty choice"),
        ({"arch.no_such_key": "choice(1, 2)"}, None, SweepConfigError, r"arch.no_such_key"),
        (
            {"arch.mixer": "choice(attention, mlp_t)"},
            {"arch.mixer": {"conv": {"optim.lr": "interval(0.1, 0.2)"}}},
            SearchSpaceError,
            r"'conv' is not one of the choices",
        ),
        (
            {"optim.lr": "interval(0.1, 0.2)"},
            {"optim": {"lion": {"optim.lr": "interval(0.1, 0.2)"}}},
            SearchSpaceError,
            r"conditional parameters need 'optim' to be a choice",
        ),
        ({}, None, SearchSpaceError, r"study.space.tiny is empty"),
    ],
)
def test_bad_search_spaces_fail_before_launch(
    space: dict, conditional: dict | None, error: type, expected: str, tmp_path: Path
) -> None:
    cfg = with_space(sweep_config(f"sqlite:///{tmp_path}/db.sqlite", tmp_path), space, conditional)
    with pytest.raises(error, match=expected):
        Driver(typed_sweep(cfg)).validate()
    assert not (tmp_path / "model_scaling").exists()  # nothing launched


@pytest.mark.parametrize(
    "override,expected",
    [
        ("n_trials=0", r"n_trials=0"),
        ("max_concurrent=0", r"max_concurrent=0"),
        ("study.direction=up", r"study.direction='up'"),
        # the pruner compares in the study's direction: a loss reported to a maximized study would prune the best
        (
            "study.prune_metric=eval/lm_loss",
            r"study.prune_metric='eval/lm_loss': for a study that is to maximize expected null .* 'eval/blank_accuracy'",
        ),
        ("study.prune_metric=eval/blank_acc", r"study.prune_metric='eval/blank_acc'"),
    ],
)
def test_bad_budget_and_study_fields(override: str, expected: str, tmp_path: Path) -> None:
    with pytest.raises(SweepConfigError, match=expected):
        Driver(typed_sweep(sweep_config(f"sqlite:///{tmp_path}/db.sqlite", tmp_path, override))).validate()


def test_batch_not_divisible_by_launcher_world(tmp_path: Path) -> None:
    cfg = sweep_config(f"sqlite:///{tmp_path}/db.sqlite", tmp_path, "launcher=torchrun", "launcher.nproc_per_node=3")
    with pytest.raises(SweepConfigError, match=r"train.global_batch_size=16 is not divisible by the world size 3"):
        Driver(typed_sweep(cfg)).validate()


def test_tpu_launcher_without_name_or_zone_is_rejected(tmp_path: Path) -> None:
    cfg = sweep_config(f"sqlite:///{tmp_path}/db.sqlite", tmp_path, "launcher=tpu_pod", "launcher.zone=z")
    with pytest.raises(MissingMandatoryValue, match=r"tpu_name"):  # `???` in conf/launcher/tpu_pod.yaml
        Driver(typed_sweep(cfg)).launcher.validate()
    cfg = sweep_config(
        f"sqlite:///{tmp_path}/db.sqlite", tmp_path, "launcher=tpu_pod", "launcher.tpu_name=t", "launcher.zone=null"
    )
    with pytest.raises(LauncherConfigError, match=r"launcher.zone=None"):
        Driver(typed_sweep(cfg)).launcher.validate()


def test_existing_study_with_other_direction_is_rejected(pg_url: str, tmp_path: Path) -> None:
    optuna.create_study(study_name="taken", storage=open_storage(pg_url), direction="minimize")
    driver = Driver(typed_sweep(sweep_config(pg_url, tmp_path, "study.name=taken")))
    with pytest.raises(StudyMismatchError, match=r"study.name='taken' already exists with direction"):
        driver.open_study()


# ------------------------------------------------------------------------------------- real studies


@pytest.mark.slow
def test_torchrun_study_completes_and_prunes_with_rank0_values(pg_url: str, tmp_path: Path) -> None:
    """Two 2-process trials: a good lr (COMPLETE) then a useless one, pruned at its first eval on both ranks."""
    cfg = sweep_config(
        pg_url,
        tmp_path,
        "study.name=prune_e2e",
        "study.objective=eval/accuracy",
        "study.prune_metric=null",  # the pruner sees the objective (model_scaling's default reports blank accuracy)
        "study.enqueue_baseline=false",
        "n_trials=2",
        "launcher=torchrun",
        "launcher.nnodes=2",
        "launcher.nproc_per_node=1",
        "pruner=median",
        "pruner.n_startup_trials=1",
    )
    driver = Driver(typed_sweep(with_space(cfg, {"optim.lr": "choice(0.01, 1e-7)"})))
    study = driver.open_study()
    study.enqueue_trial({"optim.lr": 0.01})
    study.enqueue_trial({"optim.lr": 1e-7})
    driver.run()

    trials = load(pg_url, "prune_e2e").trials
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.PRUNED]
    good, bad = (summary_of(trial_dir(tmp_path / "prune_e2e", n)) for n in (0, 1))
    assert trials[0].value == pytest.approx(good["best_value"])  # the value rank 0 measured
    assert good["rank_steps"] == [20, 20]
    assert bad["outcome"] == "PRUNED" and bad["rank_steps"] == [10, 10]  # both ranks stopped at step 10
    assert trials[1].intermediate_values == {10: pytest.approx(bad["final"]["eval/accuracy"])}
    for n in (0, 1):  # each node built its own dataset in its own directory
        for node in (0, 1):
            assert (trial_dir(tmp_path / "prune_e2e", n) / f"node-{node}" / "outputs" / "data").is_dir()
    # The phase stamps the overhead benchmark reads: driver and job clocks in the order things happened.
    for trial in trials:
        job, drv = trial.user_attrs["details"]["timing"], trial.user_attrs["details"]["driver_timing"]
        stamps = [
            trial.datetime_start.timestamp(),
            drv["launched_at"][0],
            job["run_start"],
            job["first_step_start"],
            job["first_step_end"],
            job["last_step_end"],
            job["train_end"],
            job["end"],
            drv["exited_at"][0],
            trial.datetime_complete.timestamp(),
        ]
        assert stamps == sorted(stamps), stamps
        # Issue: wide nested attributes overflowed the dashboard and CLI tables. What a user reads is flat and
        # short; the nested facts are in the one `details` attribute.
        details = trial.user_attrs["details"]
        # The steady-state step speed (trm/measures/throughput.py) needs two log points: the complete trial has one, the
        # trial pruned at its first log point (step 10) has none.
        timed = {"throughput"} if trial.state == TrialState.COMPLETE else set()
        assert set(details) == {"train_overrides", "final_metrics", "timing", "driver_timing", *timed}
        assert "optim.lr=" + str(trial.params["optim.lr"]) in details["train_overrides"]
        nested = {k for k, v in trial.user_attrs.items() if isinstance(v, (dict, list))}
        # beside `details`: the job's live records, rewritten while it runs (its progress, and its sampled memory,
        # which a job the OOM killer ends leaves as its only record: storage/record.py MEMORY_ATTR)
        assert nested <= {"details", "progress", "overrides", "memory"}, nested
    # Measured speed: 10 steps (from the log point at 10 to the one at 20) of batch 16 over the job's 2 processes.
    speed = trials[0].user_attrs["details"]["throughput"]
    assert (speed["steps"], speed["devices"], speed["examples_per_device"]) == (10, 2, 8.0)
    job = trials[0].user_attrs["details"]["timing"]
    assert 0 < speed["seconds"] < job["last_step_end"] - job["first_step_end"]  # the eval at 10 is taken out
    assert speed["flops_per_s"] == pytest.approx(good["flops_per_sample_step"] * 16 * 10 / speed["seconds"], rel=1e-3)
    # ... and what `sweeps.utilization` makes of it: the fraction of a given peak, and the override to paste.
    out = subprocess.run(
        [sys.executable, "-m", "sweeps.utilization", "study=prune_e2e", f"storage.url={pg_url}", "peak_tflops=0.5"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    fraction = speed["flops_per_s"] / 2 / 0.5e12
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("cpu "))
    assert row[2:5] == ["8", "2", "1"], out  # examples/device, devices, trials (the pruned one measured nothing)
    assert f"cpu: estimate.utilization={{8:{fraction:.3g}}}" in out, out


def _start_driver(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "sweeps.run", *args], stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=Path.cwd()
    )


def _wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.mark.slow
def test_killed_driver_is_recovered_and_the_trial_resumes_from_its_checkpoint(pg_url: str, tmp_path: Path) -> None:
    slow = [o for o in FAST_TRIAL if not o.startswith("train.steps")] + ["train.steps=60"]
    args = sweep_overrides(
        pg_url, tmp_path, "study=halting", "study.name=recover", "n_trials=1", "pruner=none", trial=slow
    )
    first = _start_driver([*args, f"hydra.run.dir={tmp_path}/h1"], tmp_path / "driver1.log")
    try:
        _wait_for(
            lambda: trial_file_exists(tmp_path / "recover", 0, "checkpoints/latest.pt"),
            240,
            "the first checkpoint of trial 0",
        )
    finally:
        first.send_signal(signal.SIGKILL)  # the driver dies ...
        first.wait()
    # ... and its machine with it: the job stops too, before storing an outcome. (A job that outlives its driver
    # and stores its outcome is told that outcome: tests/test_study_record.py.)
    for pid in subprocess.run(
        ["pgrep", "-f", "trm.train.*sweep.study=recover"], capture_output=True, text=True
    ).stdout.split():
        os.kill(int(pid), signal.SIGKILL)
    second = _start_driver([*args, f"hydra.run.dir={tmp_path}/h2"], tmp_path / "driver2.log")
    restarted = time.monotonic()
    _wait_for(lambda: trial_file_exists(tmp_path / "recover", 1, "worker-0.log"), 120, "the retry of trial 0 to start")
    print(f"[fault] driver SIGKILL: retry started {time.monotonic() - restarted:.1f} s after the new driver")
    assert second.wait(timeout=300) == 0, (tmp_path / "driver2.log").read_text()[-3000:]

    trials = load(pg_url, "recover").trials
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert trials[0].state == TrialState.FAIL
    retry = trials[1]
    assert retry.state == TrialState.COMPLETE and retry.system_attrs["failed_trial"] == 0
    assert retry.params == trials[0].params
    log_text = (trial_dir(tmp_path / "recover", 1) / "worker-0.log").read_text()
    resumed = [json.loads(line) for line in log_text.splitlines() if line.startswith('{"event": "start"')]
    assert resumed and resumed[0]["resumed_from"] >= 10, log_text[-2000:]


@pytest.mark.slow
def test_two_drivers_share_a_study_without_duplicates_or_losses(pg_url: str, tmp_path: Path) -> None:
    fast = [o for o in FAST_TRIAL if not o.startswith("train.steps")] + ["train.steps=10"]
    args = sweep_overrides(
        pg_url, tmp_path, "study=halting", "study.name=shared", "n_trials=4", "pruner=none", trial=fast
    )
    drivers = [_start_driver([*args, f"hydra.run.dir={tmp_path}/h{i}"], tmp_path / f"d{i}.log") for i in range(2)]
    for i, driver in enumerate(drivers):
        assert driver.wait(timeout=400) == 0, (tmp_path / f"d{i}.log").read_text()[-3000:]
    trials = load(pg_url, "shared").trials
    assert len(trials) == 4
    assert sorted(t.number for t in trials) == [0, 1, 2, 3]
    assert all(t.state == TrialState.COMPLETE for t in trials)
    started = [
        line for i in range(2) for line in (tmp_path / f"d{i}.log").read_text().splitlines() if "started" in line
    ]
    assert len(started) == 4  # every trial ran exactly once, split across the two drivers


# --------------------------------------------------------------------------- other readers of studies


@pytest.mark.slow
def test_optuna_cli_and_dashboard_read_our_study(pg_url: str, tmp_path: Path) -> None:
    cfg = sweep_config(pg_url, tmp_path, "study.name=readable")
    study = Driver(typed_sweep(cfg)).open_study()
    study.enqueue_trial(
        {"arch.hidden_size": 32, "arch.L_layers": 1, "arch.H_cycles": 1, "arch.L_cycles": 1, "arch.mixer": "mlp_t"}
    )
    url = open_storage(pg_url).url  # the psycopg2 form Optuna's own tools need
    out = subprocess.run(
        [str(Path(sys.executable).parent / "optuna"), "studies", "--storage", url, "-f", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "readable" in {s["name"] for s in json.loads(out)}
    port = 18000 + os.getpid() % 1000
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "optuna-dashboard"), url, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def answers() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=2) as resp:
                    return "readable" in resp.read().decode()
            except OSError:
                return False

        _wait_for(answers, 60, "optuna-dashboard to list the study")
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.slow
def test_repeated_seeds_tell_the_mean_and_keep_the_spread(tmp_path: Path) -> None:
    cfg = sweep_config(
        f"sqlite:///{tmp_path}/db.sqlite",
        tmp_path,
        "study.name=seeds",
        "study.seeds=2",
        "n_trials=1",
        "pruner=none",
        "study.objective=eval/accuracy",
    )
    Driver(typed_sweep(with_space(cfg, {"optim.lr": "choice(0.01)"}))).run()
    trial = optuna.load_study(study_name="seeds", storage=f"sqlite:///{tmp_path}/db.sqlite").trials[0]
    per_seed = [summary_of(trial_dir(tmp_path / "seeds", 0) / f"seed-{i}")["best_value"] for i in (0, 1)]
    assert trial.state == TrialState.COMPLETE
    assert trial.user_attrs["seed_values"] == pytest.approx(per_seed)
    assert trial.value == pytest.approx(sum(per_seed) / 2)
    assert trial.user_attrs["seed_std"] == pytest.approx(abs(per_seed[0] - per_seed[1]) / 2)


@pytest.mark.slow
def test_a_new_study_under_an_old_name_trains_instead_of_resuming_the_old_checkpoints(tmp_path: Path) -> None:
    """Issue: a new storage (or a deleted study) under the same study name and output_root resumed the old
    trial 0's latest.pt and was COMPLETE in seconds with no training. Trial directories carry the study's uid."""
    runs = []
    for db in ("first", "second"):
        url = f"sqlite:///{tmp_path}/{db}.sqlite"
        cfg = sweep_config(url, tmp_path, "study.name=renamed", "n_trials=1", "pruner=none")
        Driver(typed_sweep(with_space(cfg, {"optim.lr": "choice(0.01)"}))).run()
        study = optuna.load_study(study_name="renamed", storage=url)
        trial = study.trials[0]
        assert trial.state == TrialState.COMPLETE, trial.user_attrs
        runs.append((study.user_attrs["uid"], Path(trial.user_attrs["workdir"])))
    (first_uid, first_dir), (second_uid, second_dir) = runs
    assert first_uid != second_uid and first_dir != second_dir
    assert second_dir == tmp_path / "renamed" / second_uid[:8] / "trial-0"
    records = [json.loads(line) for line in (second_dir / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "train/lm_loss" in r] == [10, 20]  # trained from step 0, not resumed
    assert summary_of(first_dir)["steps"] == summary_of(second_dir)["steps"] == 20


@pytest.mark.slow
def test_trials_report_the_prune_metric_and_are_valued_by_the_objective(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/db.sqlite"
    cfg = sweep_config(
        url, tmp_path, "study.name=smooth", "n_trials=1", "pruner=none", "study.prune_metric=eval/blank_accuracy"
    )
    Driver(typed_sweep(with_space(cfg, {"optim.lr": "choice(0.01)"}))).run()
    trial = optuna.load_study(study_name="smooth", storage=url).trials[0]
    evals = [
        json.loads(line)
        for line in (trial_dir(tmp_path / "smooth", 0) / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    blank = {r["step"]: r["eval/blank_accuracy"] for r in evals if "eval/blank_accuracy" in r}
    assert trial.intermediate_values == pytest.approx(blank) and len(blank) == 2
    assert trial.value == summary_of(trial_dir(tmp_path / "smooth", 0))["best_value"]  # the objective: exact accuracy
    # Reopening the study with another prune metric would make the pruner compare two metrics: refused.
    other = sweep_config(url, tmp_path, "study.name=smooth", "n_trials=2", "study.prune_metric=eval/exact_accuracy")
    with pytest.raises(
        StudyMismatchError,
        match=r"reported 'eval/blank_accuracy' to the pruner but this config reports 'eval/exact_accuracy'",
    ):
        Driver(typed_sweep(other)).open_study()


SECRET = "pw-s3cr3t-4242"


@pytest.mark.slow
def test_a_password_in_the_url_is_refused_without_echoing_it(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sweeps.run",
            f"storage.url=postgresql://postgres:{SECRET}@127.0.0.1:5432/x",
            "storage=postgres",
            f"hydra.run.dir={tmp_path}/h",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "storage.url" in proc.stderr and ("pgpass" in proc.stderr or "password_env" in proc.stderr)
    assert SECRET not in proc.stderr + proc.stdout


@pytest.mark.slow
def test_pareto_study_tells_accuracy_and_compute(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/db.sqlite"
    cfg = sweep_config(
        db,
        tmp_path,
        "study=model_scaling_pareto",
        "sampler=nsga2",
        "n_trials=2",
        "pruner=none",
        "study.enqueue_baseline=false",
    )
    Driver(typed_sweep(with_space(cfg, {"arch.H_cycles": "choice(1, 2)"}))).run()
    study = optuna.load_study(study_name="model_scaling_pareto", storage=db)
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    trained = [t for t in study.trials if "duplicate_of" not in t.user_attrs]  # a repeated draw is refused, not trained
    assert len(trained) == 2 and trained[0].params != trained[1].params
    for trial in trained:
        assert trial.state == TrialState.COMPLETE
        assert trial.values[1] == trial.user_attrs["compute_flops"] > 0
        assert trial.user_attrs["flops_per_sample_step"] * 16 * 20 == trial.user_attrs["compute_flops"]
    assert study.best_trials  # the Pareto front


@pytest.mark.slow
def test_a_killed_worker_fails_the_trial_named_and_its_retry_resumes(tmp_path: Path) -> None:
    """SIGKILL of a worker mid-trial: FAIL with the worker named, then a retry that continues from the checkpoint."""
    # 120 steps: the kill comes right after the step-10 checkpoint, and the retry trains the rest again.
    slow = [o for o in FAST_TRIAL if not o.startswith("train.steps")] + ["train.steps=120"]
    db = f"sqlite:///{tmp_path}/db.sqlite"
    args = sweep_overrides(
        db,
        tmp_path,
        "study=halting",
        "study.name=crash",
        "n_trials=1",
        "pruner=none",
        "launcher=torchrun",
        "launcher.nnodes=2",
        "launcher.nproc_per_node=1",
        trial=slow,
    )
    driver = _start_driver([*args, f"hydra.run.dir={tmp_path}/h"], tmp_path / "driver.log")
    _wait_for(
        lambda: trial_file_exists(tmp_path / "crash", 0, "checkpoints/latest.pt"), 240, "trial 0's first checkpoint"
    )

    def node1_worker() -> list[str]:
        agents = subprocess.run(
            ["pgrep", "-f", "node_rank=1 .*sweep.study=crash .*sweep.trial_number=0"], capture_output=True, text=True
        ).stdout.split()  # this study's agent only: other tests' jobs run beside it (xdist)
        return [
            p for a in agents for p in subprocess.run(["pgrep", "-P", a], capture_output=True, text=True).stdout.split()
        ]

    _wait_for(lambda: bool(node1_worker()), 60, "node 1's training process")
    os.kill(int(node1_worker()[0]), signal.SIGKILL)
    assert driver.wait(timeout=400) == 0, (tmp_path / "driver.log").read_text()[-3000:]
    trials = optuna.load_study(study_name="crash", storage=db).trials
    assert trials[0].state == TrialState.FAIL and "node-1 exited" in trials[0].user_attrs["fail_reason"]
    assert trials[1].state == TrialState.COMPLETE and trials[1].system_attrs["failed_trial"] == 0
    log_text = (trial_dir(tmp_path / "crash", 1) / "node-0.log").read_text()
    resumed = [json.loads(line) for line in log_text.splitlines() if line.startswith('{"event": "start"')]
    assert resumed and resumed[0]["resumed_from"] >= 10  # its metrics continue from the checkpoint's step


@pytest.mark.slow
@pytest.mark.parametrize(
    "override,expected",
    [
        ("study=no_such_study", "Could not find 'study/no_such_study'"),
        ("no_such_key=1", "no_such_key"),
        ("launcher=tpu_pod", "tpu_name"),
    ],
)
def test_bad_command_lines_fail_with_the_key_named(override: str, expected: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sweeps.run",
            override,
            f"output_root={tmp_path}/out",
            f"storage.url=sqlite:///{tmp_path}/db",
            f"hydra.run.dir={tmp_path}/h",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert expected in proc.stderr + proc.stdout
    assert not (tmp_path / "out").exists()  # nothing launched


def test_missing_dataset_path_fails_before_launch(tmp_path: Path) -> None:
    trial = [
        *FAST_TRIAL,
        "data=sudoku_extreme",
        "~data.num_train",  # the test_tiny preset's sizes of generated data: a built dataset has none
        "~data.num_test",
        "~data.blanks",
        f"data.path={tmp_path}/no-such-data",
    ]
    with pytest.raises(SweepConfigError, match=r"data.path=.*no-such-data.*no dataset there"):
        Driver(typed_sweep(sweep_config(f"sqlite:///{tmp_path}/db.sqlite", tmp_path, trial=trial))).validate()
