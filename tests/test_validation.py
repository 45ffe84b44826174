"""Issue 14: input that validation accepted but that failed every trial (or the driver, after the study was opened)
while the driver exited 0. Each is now refused before anything runs, with one error naming the key, the value and
what is accepted; names and paths with commas, quotes or non-ASCII letters reach the trials intact."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from omegaconf import DictConfig, open_dict
from optuna.trial import TrialState

from contracts.hydra_app import compose_train_config, train_values
from contracts.metric_names import EVAL_METRICS, LOGGED_METRICS, METRIC_KEYS, TRIAL_NUMBERS
from storage.trial_record import ATTEMPT_ATTRS
from sweeps.config.optuna_parts import pruner_spec
from sweeps.config.schema import Objective
from sweeps.config.typed_config import typed_sweep
from sweeps.driver import Driver
from sweeps.launchers.base import JobSpec
from sweeps.launchers.job_command import job_name
from sweeps.launchers.quoting import quote_literals
from sweeps.launchers.tpu.launcher import TpuPodLauncher
from sweeps.validation.validate import SweepConfigError
from tests.sweep_helpers import FAST_TRIAL, summary_of, sweep_config, sweep_overrides, trial_dir


def config(tmp_path: Path, *extra: str, trial: list[str] | None = None) -> DictConfig:
    return sweep_config(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "out", *extra, trial=trial)


def refused(cfg: DictConfig, expected: str) -> None:
    """Validation refuses `cfg` with `expected` (a regex) in its one error, and nothing was stored or made."""
    with pytest.raises(SweepConfigError, match=expected):
        Driver(typed_sweep(cfg)).validate()
    root = Path(cfg.output_root)
    assert not root.exists() and not (root.parent / "db.sqlite").exists()


def refused_composing(tmp_path: Path, expected: str, *extra: str, trial: list[str] | None = None) -> None:
    """As `refused`, for input the schema refuses already while the config is composed (sweeps/config/schema.py)."""
    with pytest.raises(SweepConfigError, match=expected):
        Driver(typed_sweep(config(tmp_path, *extra, trial=trial))).validate()
    assert not (tmp_path / "out").exists() and not (tmp_path / "db.sqlite").exists()


def with_space(cfg: DictConfig, space: dict, conditional: dict | None = None) -> DictConfig:
    """Replace the tiny-scale search space (its keys contain dots, so not via the command line)."""
    with open_dict(cfg):
        cfg.study.space.tiny = space
        cfg.study.conditional.tiny = conditional or {}
    return cfg


def trial_with(*overrides: str) -> list[str]:
    """FAST_TRIAL with some training keys replaced (the last value of a key wins)."""
    return [*FAST_TRIAL, *overrides]


# ------------------------------------------------------------------------- 1. metric names


def test_metric_names_are_what_the_trainer_logs_and_stores() -> None:
    from trm.losses import normalize_metrics  # torch: the test may, the driver may not

    assert set(normalize_metrics([1.0] * len(METRIC_KEYS), "eval")) == set(EVAL_METRICS)
    assert set(TRIAL_NUMBERS) <= set(ATTEMPT_ATTRS)  # numbers the job stores on its trial (trm/links/trial.py)


def test_every_logged_metric_has_its_meaning_in_docs_fidelity() -> None:
    """docs/fidelity.md's Metrics table names each metric the trainer logs (and only those), with its meaning."""
    from trm.losses import normalize_metrics

    text = (Path(__file__).parent.parent / "docs" / "fidelity.md").read_text()
    section = text.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    documented = {line.split("`")[1] for line in section.splitlines() if line.startswith("| `")}
    for prefix in ("train", "eval"):
        logged = {key.split("/", 1)[1] for key in normalize_metrics([1.0] * len(METRIC_KEYS), prefix)}
        assert logged == documented == set(LOGGED_METRICS), prefix


@pytest.mark.parametrize(
    "override,expected",
    [
        # today: a KeyError at each trial's first eval
        (
            "study.objective=eval/exact_acc",
            r"study.objective='eval/exact_acc': not a metric the trainer produces .*'eval/exact_accuracy'",
        ),
        # train metrics are logged, but the objective is read from the evals
        (
            "study.objective=train/lm_loss",
            r"study.objective='train/lm_loss': not a metric the trainer produces at its evals",
        ),
    ],
)
def test_an_objective_the_trainer_does_not_produce_is_refused(override: str, expected: str, tmp_path: Path) -> None:
    refused(config(tmp_path, override), expected)


@pytest.mark.slow
def test_extra_objectives_name_a_stored_number_or_an_eval_metric(tmp_path: Path) -> None:
    cfg = config(tmp_path, "study=model_scaling_pareto", "sampler=nsga2", "pruner=none")
    Driver(typed_sweep(cfg)).validate()  # compute_flops: a number the job stores on its trial
    with open_dict(cfg):
        cfg.study.objectives = [Objective(name="eval/lm_loss", direction="minimize")]  # the schema's type
    Driver(typed_sweep(cfg)).validate()  # an eval metric is read from the trial's final metrics
    with open_dict(cfg):
        cfg.study.objectives = [Objective(name="compute_flop", direction="minimize")]
    refused(
        cfg,
        r"study.objectives\[0\].name='compute_flop': not a value a trial records; expected one of \[.*'compute_flops'",
    )


# ------------------------------------------------------------------------- 2. range types


@pytest.mark.parametrize(
    "space,conditional,expected",
    [
        (
            {"arch.L_layers": "interval(2, 7)"},
            None,
            r"study.space.tiny\['arch.L_layers'\]='interval\(2, 7\)': arch.L_layers is an integer in the training config \(now 1\) but interval\(...\) draws floats; use range\(2, 8\)",
        ),
        (
            {"arch.L_layers": "choice(a, b)"},
            None,
            r"\['arch.L_layers'\]='choice\(a, b\)': arch.L_layers is an integer .* the choice 'a' is a string",
        ),
        ({"arch.L_layers": "choice(1, 2.5)"}, None, r"\['arch.L_layers'\].* the choice 2.5 is a number"),
        # a key typed by the training config's schema (contracts/train_config.py): refused as the trial's config is
        # composed with the value drawn, naming the key and the value
        (
            {"optim.lr": "choice(fast, slow)"},
            None,
            r"\['optim.lr'\]='fast' does not fit the training config .*optim.lr='fast': .*could not be converted to Float",
        ),
        (
            {"train.ema": "range(0, 2)"},
            None,
            r"\['train.ema'\]='range\(0, 2\)': train.ema is a boolean \(true/false\) .* range\(...\) draws integers",
        ),
        # every option of a config group, not only the first (the one a trial would compose today)
        (
            {"optim": "choice(adamw, lionx)"},
            None,
            r"study.space.tiny\['optim'\]='lionx' does not fit the training config",
        ),
        # a conditional branch is checked against the config of its own choice
        (
            {"optim": "choice(adamw, lion)"},
            {"optim": {"lion": {"optim.warmup_steps": "interval(10, 100)"}}},
            r"does not fit the training config .*optim.warmup_steps=10.0: .*could not be converted to Integer",
        ),
    ],
)
@pytest.mark.slow
def test_a_range_that_does_not_fit_the_keys_type_is_refused(
    space: dict, conditional: dict | None, expected: str, tmp_path: Path
) -> None:
    refused(with_space(config(tmp_path), space, conditional), expected)


# ------------------------------------------------------------------------- 3. sampler and pruner


@pytest.mark.parametrize(
    "override,expected",
    [
        # Hyperband takes these at construction and divides by zero / takes log(0) in every trial's report
        (["pruner=hyperband", "pruner.reduction_factor=1"], r"pruner.reduction_factor=1: expected an integer >= 2"),
        (["pruner=hyperband", "pruner.min_resource=0"], r"pruner.min_resource=0: expected an integer >= 1"),
        (
            ["pruner=hyperband", "pruner.min_resource=abc"],
            r"pruner.min_resource='abc': HyperbandPruner takes an integer here",
        ),
        # ... also wrapped in the evidence pruner, named by their full key
        (
            ["pruner=evidence", "pruner.wrapped.reduction_factor=1"],
            r"pruner.wrapped.reduction_factor=1: expected an integer >= 2",
        ),
        (["pruner=evidence", "pruner.wrapped._target_=os.system"], r"pruner.wrapped._target_='os.system': .*whitelist"),
        (
            ["pruner=evidence", "pruner.min_agreement=2"],
            r"pruner \(contracts.pruning.evidence.EvidencePruner\): ValueError: min_agreement=2",
        ),
        (
            ["pruner=evidence", "pruner.audit_first=2", "pruner.audit_every=0"],
            r"audit_first=2 < min_audit=4 with audit_every=0",
        ),
        # a warmup share outside (0, 1) is steps: a float of steps is refused by Optuna's own check
        (["pruner=median_late", "pruner.n_warmup_steps=-0.5"], r"pruner.n_warmup_steps=-0.5"),
        # TPE takes it and fails at the first ask past its start-up trials
        (
            ["sampler=tpe", "sampler.n_startup_trials=abc"],
            r"sampler.n_startup_trials='abc': TPESampler takes an integer here",
        ),
        (["seed=abc"], r"seed='abc': expected an integer, not str"),  # the schema's type, at composition
        (
            ["sampler=tpe", "+sampler.n_startup=4"],
            r"sampler.n_startup=4: not an argument of TPESampler; accepted: \[.*'n_startup_trials'",
        ),
        (["pruner=median", "pruner.interval_steps=0"], r"pruner.interval_steps=0: expected an integer >= 1"),
        (["sampler=nsga2", "sampler.population_size=1"], r"sampler.population_size=1: expected an integer >= 2"),
        (["sampler._target_=os.system"], r"sampler._target_='os.system': .*whitelist"),
    ],
)
@pytest.mark.slow
def test_sampler_and_pruner_are_built_before_launch(override: list[str], expected: str, tmp_path: Path) -> None:
    refused_composing(tmp_path, expected, *override)


@pytest.mark.parametrize(
    "trial,expected",
    [
        (["train.compile=fast"], r"train.compile='fast': .*expected one of \['off', 'net', 'model'"),
        (["train.precision=fp16"], r"train.precision='fp16': .*expected one of \['auto', 'fp32', 'bf16'"),
        (["train.bf16_mode=half"], r"train.bf16_mode='half': .*expected one of \['bf16', 'bf16_reference'\]"),
        (["runtime.device=gpu"], r"runtime.device='gpu': .*expected one of \['auto', 'cpu', 'cuda'\]"),
        # A typo in trial.overrides was blamed on a searched key whose last part the message happened to hold.
        (["train.stpes=200"], r"train.stpes: Key 'stpes' not in 'TrainLoop'. Did you mean: 'steps'"),
        (["optim.lr=-1"], r"optim.lr=-1"),
    ],
)
def test_train_choices_are_refused_before_the_first_trial(trial: list[str], expected: str, tmp_path: Path) -> None:
    """The job would refuse these at its start, after the driver had stored a trial and launched it. The training
    config's schema (contracts/train_config.py) refuses them as the trial's config is composed, naming the
    override of trial.overrides it comes from."""
    refused(
        config(tmp_path, trial=trial_with(*trial)),
        rf"^trial.overrides: '{re.escape(trial[0])}' does not fit the training config \(conf/train.yaml\): " + expected,
    )


@pytest.mark.slow
def test_the_sweep_driver_does_not_import_torch() -> None:
    """The driver process stays light (start-up, memory beside the trials); torch is the trials' business."""
    code = "import sys, sweeps.run, sweeps.driver, sweeps.validation.validate; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# ------------------------------------------------------------------------- 4. counts


@pytest.mark.parametrize(
    "override,trial,expected",
    [
        # a YAML `true` is no count: the schema's types refuse it while composing
        ("n_trials=true", None, r"n_trials=True: expected an integer, not bool"),
        ("max_concurrent=true", None, r"max_concurrent=True: expected an integer, not bool"),
        ("timeout=true", None, r"timeout=True: expected a number, not bool"),
        ("study.seeds=true", None, r"study.seeds=True: expected an integer, not bool"),
        ("n_trials=0", None, r"n_trials=0: expected an integer >= 1"),
        ("study.seeds=0", None, r"study.seeds=0: expected an integer >= 1"),
        ("max_concurrent=0", None, r"max_concurrent=0: expected an integer >= 1, or null \(one trial per slot\)$"),
        (
            "+trial.train_steps=60",
            None,
            r"trial.train_steps is gone: the trial length is train.steps in trial.overrides",
        ),
        ("+trial.steps=60", None, r"trial.steps: not a trial setting, so nothing would read it"),
        # the training config's schema (contracts/train_config.py), as the trial's config is composed
        (None, ["train.steps=0"], r"training config \(conf/train.yaml\): train.steps=0: expected a whole number >= 1"),
        (None, ["train.steps=-5"], r"training config \(conf/train.yaml\): train.steps=-5: expected"),
        (None, ["train.eval_interval=0"], r"train.eval_interval=0: expected a whole number >= 1"),
        (None, ["train.log_interval=0"], r"train.log_interval=0: expected a whole number >= 1"),
        (
            None,
            ["train.eval_examples=0"],
            r"train.eval_examples=0: expected a whole number >= 1, or null \(the whole test split\)",
        ),
        (None, ["train.global_batch_size=0"], r"train.global_batch_size=0: expected a whole number >= 1"),
    ],
)
def test_counts_that_are_not_positive_integers_are_refused(
    override: str | None, trial: list[str] | None, expected: str, tmp_path: Path
) -> None:
    refused_composing(
        tmp_path, expected, *([override] if override else []), trial=trial_with(*trial) if trial else None
    )


@pytest.mark.slow
def test_eval_examples_null_is_the_whole_split(tmp_path: Path) -> None:
    Driver(typed_sweep(config(tmp_path, trial=trial_with("train.eval_examples=null")))).validate()
    refused(config(tmp_path, trial=trial_with("train.eval_examples=true")), r"train.eval_examples=True")


# ------------------------------------------------------------------------- 5. the machine


@pytest.mark.slow
def test_the_local_launchers_interpreter_must_exist_and_have_the_project(tmp_path: Path) -> None:
    Driver(typed_sweep(config(tmp_path, f"launcher.python={sys.executable}"))).validate()
    refused(
        config(tmp_path, "launcher.python=/no/such/python"),
        r"launcher.python='/no/such/python': no such executable .* or null for the driver's own",
    )
    refused(
        config(tmp_path, "launcher=torchrun", "launcher.nproc_per_node=1", "launcher.python=no-such-python3"),
        r"launcher.python='no-such-python3': no such executable",
    )
    bare = tmp_path / "bin" / "python"  # runs, but has no trm: every job would die at its import
    bare.parent.mkdir()
    bare.write_text("#!/bin/sh\nexit 1\n")
    bare.chmod(0o755)
    refused(config(tmp_path, f"launcher.python={bare}"), r"launcher.python='.*/bin/python': it cannot import trm")


@pytest.mark.slow
def test_an_output_root_that_cannot_be_written_is_refused_and_a_new_one_left_as_it_was(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cfg = config(tmp_path)
    cfg.output_root = str(blocker / "out")
    with pytest.raises(SweepConfigError, match=r"output_root='.*/a-file/out': cannot write there \(Not a directory\)"):
        Driver(typed_sweep(cfg)).validate()
    cfg.output_root = str(tmp_path / "new" / "deeper")
    Driver(typed_sweep(cfg)).validate()  # writable: probed by making it, and removed again (a dry run makes nothing)
    assert not (tmp_path / "new").exists()


# ------------------------------------------------------------------------- 6. names and paths


@pytest.mark.parametrize(
    "name,expected",
    [
        ("''", r"study.name='': it names the study's directory under output_root"),
        ("../x", r"study.name='../x': .*no '/'"),
        ("a/b", r"study.name='a/b': .*no '/'"),
        ("..", r"study.name='..': .*not '.' or '..'"),
        ("123", r"study.name=123: expected a string; quote it to keep it one: study.name='123'"),
    ],
)
def test_a_study_name_that_cannot_be_a_directory_is_refused(name: str, expected: str, tmp_path: Path) -> None:
    refused(config(tmp_path, f"study.name={name}"), expected)


ODD = ["a, b", "it's", "é/日本", "${x}", "back\\slash\\", "x=1#2", "123", "true"]


@pytest.mark.parametrize("value", ODD)
def test_literal_values_reach_the_job_as_they_are(value: str) -> None:
    overrides = quote_literals(
        [
            f"out_dir=/tmp/{value}",
            f"sweep.study={value}",
            f"sweep.storage=sqlite:////tmp/{value}/db",
            "optim.betas=[0.9,0.95]",
        ]
    )
    job = compose_train_config(overrides)
    assert (job.out_dir, job.sweep.study, job.sweep.storage) == (f"/tmp/{value}", value, f"sqlite:////tmp/{value}/db")
    assert list(job.optim.betas) == [0.9, 0.95]  # the user's Hydra expressions are left as they are
    assert quote_literals(["out_dir=/tmp/plain", "sweep.study=halting"]) == [
        "out_dir=/tmp/plain",
        "sweep.study=halting",
    ]


def vm_job(spec: JobSpec, tmp_path: Path) -> tuple[list[str], str, str]:
    """What the VM's shell hands to launcher.python for `spec`'s job, and the command lines `pkill -f` sees: the
    training process's and its shell's. The remote command is run by bash, as sshd runs it, with launcher.python a
    script that records its argv."""
    python, record = tmp_path / "python", tmp_path / "argv.bin"
    python.write_text(f"#!/bin/sh\nprintf '%s\\0' \"$@\" > {shlex.quote(str(record))}\n")
    python.chmod(0o755)
    command = TpuPodLauncher(tpu_name="t", zone="z", python=str(python)).remote_command(spec)
    subprocess.run(["bash", "-c", command], check=True, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    argv = record.read_bytes().decode().split("\0")[:-1]
    return argv, " ".join([str(python), *argv]), f"bash -c {command}"


def cancel_pattern(spec: JobSpec) -> str:
    return shlex.split(TpuPodLauncher(tpu_name="t", zone="z").cancel_command(spec))[4]  # pkill -TERM -f -- PATTERN


@pytest.mark.slow  # starts a process
def test_a_pod_job_and_its_cancel_pattern_carry_an_odd_study_name(tmp_path: Path) -> None:
    spec = JobSpec("a, b's-0", ["out_dir=runs/a, b's/trial-0/run"], tmp_path)
    argv, process, shell = vm_job(spec, tmp_path)
    job = compose_train_config(argv[2:])  # after -m trm.train
    assert (job.sweep.job, job.out_dir) == ("a, b's-0", "runs/a, b's/trial-0/run")
    # pkill -f matches the training process, not the shell waiting on it (a shell killed by a signal ends the
    # ssh session with 255, which gcloud answers by running the job again).
    assert re.search(cancel_pattern(spec), process) and not re.search(cancel_pattern(spec), shell)


@pytest.mark.slow  # starts a process
def test_same_named_studies_never_cancel_each_others_pod_jobs(tmp_path: Path) -> None:
    """Two studies called `halting` (two storages, or two tests at once) on the same machines: each job's cancel
    pattern (pkill -f) matches its own command line and not the other's, though both are trial 0."""
    specs = [JobSpec(job_name("halting", uid, 0), ["out_dir=o"], tmp_path) for uid in ("0123abcdef", "4567abcdef")]
    lines = [vm_job(spec, tmp_path)[1] for spec in specs]
    patterns = [cancel_pattern(spec) for spec in specs]
    assert [bool(re.search(patterns[0], line)) for line in lines] == [True, False]
    assert [bool(re.search(patterns[1], line)) for line in lines] == [False, True]


@pytest.mark.slow
def test_a_study_with_a_quote_and_non_ascii_in_its_name_and_a_comma_in_output_root_runs(tmp_path: Path) -> None:
    """The study name and output_root end up in every trial's overrides (out_dir, checkpoint.url, sweep.study,
    sweep.storage): each must arrive as itself, or the trial fails at its first line."""
    root = tmp_path / "out, o'é"
    root.mkdir()
    db = f"sqlite:///{root}/db.sqlite"  # sweep.storage carries the odd path too
    name = "scaling v2's é"  # a comma is refused (storage/study_name.py): it separates studies in study=a,b
    cfg = sweep_config(f"sqlite:///{tmp_path}/unused.sqlite", tmp_path, "n_trials=1", "pruner=none")
    cfg.storage.url, cfg.output_root, cfg.study.name = db, str(root), name  # not valid unquoted overrides themselves
    Driver(typed_sweep(with_space(cfg, {"optim.lr": "choice(0.01)"}))).run()
    trial = optuna.load_study(study_name=name, storage=db).trials[0]
    assert trial.state == TrialState.COMPLETE, trial.user_attrs.get("fail_reason")
    workdir = trial_dir(root / name, 0)
    assert Path(trial.user_attrs["workdir"]) == workdir
    assert summary_of(workdir)["outcome"] == "COMPLETE"  # out_dir arrived intact
    assert (workdir / "checkpoints" / "latest.pt").exists()  # checkpoint.url too


# ------------------------------------------------------------------------- the command line


@pytest.mark.slow
@pytest.mark.parametrize(
    "override,expected",
    [
        (
            "study.objective=eval/exact_acc",
            "error: study.objective='eval/exact_acc': not a metric the trainer produces",
        ),
        ("sampler.n_startup_trials=-1", "error: sampler.n_startup_trials=-1: expected an integer >= 0"),
        ("n_trials=true", "error: n_trials=True: expected an integer, not bool"),  # composing: Hydra's error, one line
        ("+arch=tiny", "error: ['arch'] are not sweep settings"),
        ("study.name=../escape", "error: study.name='../escape'"),
        ("output_root={tmp}/a-file/out", "error: output_root='{tmp}/a-file/out': cannot write there"),
        # Each trial trained to its first checkpoint, failed with ENOTDIR, and was retried twice.
        ("trial.checkpoint_root={tmp}/a-file/ck", "error: trial.checkpoint_root='{tmp}/a-file/ck': cannot write there"),
    ],
)
def test_the_driver_exits_2_with_one_line_naming_the_key(override: str, expected: str, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    args = sweep_overrides(
        f"sqlite:///{tmp_path}/db.sqlite",
        tmp_path / "out",
        override.format(tmp=tmp_path),
        f"hydra.run.dir={tmp_path}/h",
    )
    proc = subprocess.run([sys.executable, "-m", "sweeps.run", *args], capture_output=True, text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(errors) == 1 and errors[0].startswith(expected.format(tmp=tmp_path)), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "db.sqlite").exists() and not (tmp_path / "out").exists()  # no study opened, no trial used


@pytest.mark.parametrize(
    "override, expected",
    [
        ("stall_timeout_s=0", r"stall_timeout_s=0: expected seconds > 0"),
        ("timeout=0", r"timeout=0: expected seconds > 0, or null \(no limit\)$"),
        ("heartbeat.interval_s=0", r"heartbeat.interval_s=0: expected a whole number of seconds >= 1"),
        # Passed the schema, then Optuna's storage took int(0.5): "heartbeat.interval_s = 0 ...".
        ("heartbeat.interval_s=0.5", r"heartbeat.interval_s=0.5: expected a whole number of seconds >= 1"),
        ("wandb.init_timeout_s=0", r"wandb.init_timeout_s=0: expected seconds > 0"),
        ("wandb.finish_timeout_s=0", r"wandb.finish_timeout_s=0: expected seconds > 0"),
        ("heartbeat.grace_s=1", r"heartbeat.grace_s=1 must exceed heartbeat.interval_s=1"),
    ],
)
def test_heartbeat_and_stall_settings_are_refused_with_the_key(override: str, expected: str, tmp_path: Path) -> None:
    """Issue: heartbeat.interval_s=0 was Optuna's message without the key."""
    refused(config(tmp_path, override), expected)


@pytest.mark.parametrize(
    "baseline, expected",
    [
        ({"arch.hidden_size": 96}, r"study.baseline.tiny.arch.hidden_size=96: outside this study's space \(int \[32, 64\] step 32\)"),
        ({"arch.mixer": "conv"}, r"study.baseline.tiny.arch.mixer='conv': outside this study's space \(choice\(attention, mlp_t\)\)"),
        ({"optim": "lion", "optim.lr": 0.5}, r"study.baseline.tiny.optim.lr=0.5: outside this study's space \(float \[1e-05, 0.001\] log\)"),
    ],
)  # fmt: skip
def test_a_baseline_outside_the_space_is_refused_before_the_study_opens(
    baseline: dict, expected: str, tmp_path: Path
) -> None:
    """The driver enqueues the baseline into a new study once: a value the space does not take would fail that
    trial before it starts, and the study would never get its baseline. A conditional key is checked in its branch."""
    cfg = with_space(
        config(tmp_path),
        {
            "arch.hidden_size": "range(32, 96, 32)",
            "arch.mixer": "choice(attention, mlp_t)",
            "optim": "choice(adamw, lion)",
        },
        {"optim": {"lion": {"optim.lr": "tag(log, interval(1e-5, 1e-3))"}}},
    )
    with open_dict(cfg):
        cfg.study.baseline.tiny = baseline
    refused(cfg, expected)
    with open_dict(cfg):
        cfg.study.enqueue_baseline = False  # not enqueued: nothing to check
    Driver(typed_sweep(cfg)).validate()


@pytest.mark.parametrize(
    "override, key", [("+train.steps=60", "train"), ("+arch=tiny", "arch"), ("+optim.lr=0.1", "optim")]
)
def test_an_override_every_trial_would_ignore_is_refused_naming_the_right_form(
    override: str, key: str, tmp_path: Path
) -> None:
    """Issue 15: `sweeps.run +train.steps=60` (the old error's own hint) was accepted and silently ignored."""
    refused_composing(
        tmp_path, rf"\['{key}'\] are not sweep settings, so every trial would ignore them.*trial\.overrides", override
    )


# ------------------------------------------------------------------------- the trial length, said once


@pytest.mark.slow
def test_the_trial_length_is_train_steps_in_trial_overrides(tmp_path: Path) -> None:
    """Issue: the site stated the length twice (train.steps in trial.overrides and trial.train_steps); a user
    who changed one got trials and a pruner that disagreed. Now the pruner's max resource comes from the trial's
    own training config."""
    driver = Driver(typed_sweep(config(tmp_path, "pruner=median_late", trial=trial_with("train.steps=70"))))
    driver.validate()
    assert driver.train_steps == 70
    assert pruner_spec(driver.sweep.pruner, driver.train_steps)["n_warmup_steps"] == 35  # half the trial
    searched = config(tmp_path)
    with open_dict(searched):
        searched.study.space.tiny["train.steps"] = "range(10, 50, 10)"
    refused(searched, r"study.space.tiny\['train.steps'\]: the trial length is the pruner's max resource")


def test_the_hints_examples_of_trial_overrides_compose_as_written() -> None:
    """The refusal of a training key suggested `'trial.overrides=[experiment=tiny_cpu,...]'`, which Hydra's grammar
    refuses ("no viable alternative"): each example a hint gives is composed here as a user would paste it."""
    from sweeps.config.compose import compose_sweep_config
    from sweeps.config.typed_config import GONE, IGNORED_HINT

    for hint in (IGNORED_HINT, *GONE.values()):
        (example,) = re.findall(r"'(trial\.overrides=\[.*?\])'", hint)
        assert list(compose_sweep_config([example]).trial.overrides) == ["experiment=tiny_cpu", "train.steps=60"]


@pytest.mark.slow  # starts a process
def test_a_dry_run_names_a_model_setting_the_model_refuses_in_one_line(tmp_path: Path) -> None:
    """The dry run's cost estimate builds every trial's model (trm.info): a setting the model refuses was a
    RuntimeError traceback there."""
    args = sweep_overrides(
        f"sqlite:///{tmp_path}/db.sqlite",
        tmp_path / "out",
        "study=optimizer",  # arch.mixer is not searched there: the trials keep the setting
        "dry_run=true",
        f"hydra.run.dir={tmp_path}/h",
        trial=[*FAST_TRIAL, "arch.mixer=foo"],
    )
    proc = subprocess.run([sys.executable, "-m", "sweeps.run", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: trial.overrides: the model cannot be built from them: "
        "ValueError: arch.mixer='foo': expected 'attention' or 'mlp_t'"
    )


def test_sampler_grid_on_an_infinite_space_is_refused_before_anything_is_stored(tmp_path: Path) -> None:
    cfg = with_space(
        config(tmp_path, "sampler=grid"), {"optim.lr": "interval(0.0001, 0.01)", "arch.H_cycles": "range(1, 3)"}
    )
    refused(cfg, r"sampler=grid enumerates a finite space, but optim.lr is a float range without a step")


def test_a_gp_sampler_without_torch_in_the_driver_is_refused_before_any_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Optuna's GPSampler imports torch at its first fit, after the start-up trials trained: a driver installed
    without torch (the package does not require it) would fail there. Refused at validation, naming the fix."""
    import importlib.util

    from sweeps.validation.validate_optuna import check_optuna

    cfg = typed_sweep(config(tmp_path, "sampler=gp"))
    check_optuna(cfg, 500)  # torch is here: accepted
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    with pytest.raises(
        SweepConfigError, match=r"sampler._target_='optuna.samplers.GPSampler': .*needs torch.*sampler=tpe"
    ):
        check_optuna(cfg, 500)
    check_optuna(typed_sweep(config(tmp_path, "sampler=tpe")), 500)  # another sampler needs no torch


def test_a_trials_training_config_reads_as_plain_values_outside_a_hydra_run() -> None:
    """What the sweep's checks read (contracts.hydra_app.train_values): plain dicts, every value resolved that
    resolves without Hydra's run; `out_dir` (the run's directory) and what is built on it are None, as is a value
    nobody gave (`???`)."""
    values = train_values(["experiment=tiny_cpu", "arch.hidden_size=32", "data.num_train=300"])
    assert values["arch"]["hidden_size"] == 32 and type(values["optim"]) is dict
    assert values["out_dir"] is None and values["checkpoint"]["url"] is None
    assert "_n300_" in values["data"]["path"]  # the generated dataset's name, resolved from its recipe
    assert train_values(["data=sudoku_extreme"])["data"] == {"source": "path", "path": None}
