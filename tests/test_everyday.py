"""Everyday use: the Hydra way to sweep (hydra-optuna-sweeper over `trm.train`), and reusing what a study found
(`python -m sweeps.best`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from sweeps.best import main as best_main
from tests.sweep_helpers import sweep_config
from tests.test_sweeps import with_space
from trm.checkpoints import checkpoint

pytestmark = pytest.mark.slow  # every test here starts processes or trains


@pytest.mark.timeout(300)
def test_hydra_optuna_sweeper_optimizes_trm_train(tmp_path: Path, data_root: Path) -> None:
    """Issue: each trial trained, then "Return value must be float-castable. Got 'None'". The task function now
    returns the objective."""
    sweep_dir = tmp_path / "multirun"
    argv = [
        sys.executable,
        "-m",
        "trm.train",
        "-m",
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.direction=maximize",
        "hydra.sweeper.sampler.seed=0",
        "optim.lr=tag(log, interval(1e-4, 1e-2))",
        "experiment=test_tiny",
        "train.steps=10",
        "train.eval_interval=10",
        "train.log_interval=5",
        "wandb.enabled=false",
        f"data.root={data_root}",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert 1e-4 <= results["best_params"]["optim.lr"] <= 1e-2
    values = [json.loads((sweep_dir / str(i) / "summary.json").read_text())["best_value"] for i in (0, 1)]
    assert results["best_value"] == pytest.approx(max(values))  # the value each job returned: its objective


@pytest.mark.timeout(300)
def test_the_best_trial_can_be_reused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue: `best_params` names like optim.lr@adamw could not be pasted into trm.train. sweeps.best prints plain
    overrides, the command that re-trains the trial, its best checkpoint, its W&B run and its code version: the git
    commit of this checkout the job ran from, with its dirty flag (issue 46), and the content hash."""
    url = f"sqlite:///{tmp_path}/db.sqlite"
    cfg = sweep_config(
        url,
        tmp_path / "out",
        "study=optimizer",
        "study.name=reuse",
        "n_trials=1",
        "pruner=none",
        "study.enqueue_baseline=false",
        "wandb.enabled=false",
    )
    from sweeps.config.typed_config import typed_sweep
    from sweeps.driver import Driver

    Driver(
        typed_sweep(with_space(cfg, {"optim": "choice(adamw)"}, {"optim": {"adamw": {"optim.lr": "choice(0.003)"}}}))
    ).run()
    trial = optuna.load_study(study_name="reuse", storage=url).best_trial
    assert "optim.lr@adamw" in trial.params  # the conditional name Optuna keeps

    out = tmp_path / "best.json"
    with open(out, "w") as f:
        subprocess.run(
            [sys.executable, "-m", "sweeps.best", "study=reuse", "format=json", f"storage.url={url}"],
            stdout=f,
            check=True,
            timeout=120,
        )
    info = json.loads(out.read_text())
    assert info["trial"] == trial.number and info["value"] == pytest.approx(trial.value)
    assert "optim.lr=0.003" in info["overrides"] and "optim=adamw" in info["overrides"]
    assert not any("@" in o for o in info["overrides"])
    assert info["best_checkpoint"].endswith("/best.pt") and checkpoint.load(
        info["best_checkpoint"].rsplit("/", 1)[0], "best.pt"
    )
    assert info["wandb"] == {"group": "reuse", "name": f"reuse-{trial.number}"}
    assert len(info["code_version"]) == 64
    git = ["git", "-C", str(Path(__file__).resolve().parents[1])]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    changes = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True, check=True).stdout
    assert (info["code_commit"], info["code_dirty"]) == (head, bool(changes.strip()))
    assert best_main(["study=reuse", f"storage.url={url}"]) == 0
    shown = capsys.readouterr().out
    assert f"commit:     {head}{' with uncommitted changes' if changes.strip() else ''}\n" in shown
    # The re-train command runs as printed, with a shorter run and another seed appended (the last override wins).
    retrain = [sys.executable if a == "python" else a for a in info["retrain"]]
    proc = subprocess.run(
        [*retrain, "train.steps=10", "seed=3", f"out_dir={tmp_path}/retrain", "wandb.enabled=false"],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "retrain" / "summary.json").read_text())
    assert summary["outcome"] == "COMPLETE" and summary["steps"] == 10


def test_sweeps_best_help_and_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert best_main(["--help"]) == 0
    assert "python -m sweeps.best study=NAME" in capsys.readouterr().out
    assert best_main(["study=x", "colour=red"]) == 2
    assert "unknown argument 'colour'" in capsys.readouterr().err
    assert best_main(["study=x", f"storage.url=sqlite:///{tmp_path}/missing.db"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "does not exist" in err
    assert not (tmp_path / "missing.db").exists()  # a reader creates nothing


def test_sweeps_best_refuses_a_negative_trial_and_says_when_a_checkpoint_is_not_there(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """trial=-1 printed the last trial (Python's count from the end); a trial that failed before its first
    checkpoint was shown with a best.pt that does not exist."""
    url = f"sqlite:///{tmp_path}/db.sqlite"
    study = optuna.create_study(study_name="shown", storage=url)
    failed = study.ask()
    failed.set_user_attr("checkpoint_url", str(tmp_path / "trial-0" / "checkpoints"))
    study.tell(failed, state=TrialState.FAIL)
    assert best_main(["study=shown", "trial=-1", f"storage.url={url}"]) == 2
    assert "trial='-1': the study has trials 0..0" in capsys.readouterr().err
    assert best_main(["study=shown", "trial=0", f"storage.url={url}"]) == 0
    out = capsys.readouterr().out
    assert f"checkpoint: {tmp_path}/trial-0/checkpoints/best.pt (not found from here)" in out


@pytest.mark.timeout(300)
def test_a_plain_postgresql_url_works_in_optuna_and_names_the_metric(pg_url: str, tmp_path: Path) -> None:
    """Issue: the README's postgresql:// URL failed in optuna.load_study, the optuna CLI and optuna-dashboard
    (psycopg v3 missing); the dashboard said "Objective 0"."""
    from sweeps.config.typed_config import typed_sweep
    from sweeps.driver import Driver

    cfg = sweep_config(
        pg_url,
        tmp_path / "out",
        "study=halting",
        "study.name=plain-url",
        "n_trials=1",
        "pruner=none",
        "wandb.enabled=false",
    )
    Driver(typed_sweep(with_space(cfg, {"halting.exploration_prob": "choice(0.1)"}))).run()
    assert pg_url.startswith("postgresql://")
    study = optuna.load_study(study_name="plain-url", storage=pg_url)  # Optuna's own storage, the URL as written
    assert study.metric_names == ["eval/exact_accuracy"]
    assert [t.state.name for t in study.trials] == ["COMPLETE"]
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "optuna"),
            "trials",
            "--study-name",
            "plain-url",
            "--storage",
            pg_url,
            "-f",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)[0]["state"] == "COMPLETE"


def test_status_exports_csv_that_agrees_with_optunas_dataframe(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Issue: `trials_dataframe()` failed (no pandas) and there was no export. `sweeps.status format=csv` writes
    one row per trial with plain parameter names; pandas (the `pandas` extra) reads the same study in Optuna."""
    import csv
    import io

    from sweeps.status import main as status_main

    url = f"sqlite:///{tmp_path}/db.sqlite"
    study = optuna.create_study(study_name="export", storage=url, direction="maximize")
    lr = optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)
    optim = optuna.distributions.CategoricalDistribution(["adamw", "lion"])
    for number, (state, value) in enumerate(
        [(TrialState.COMPLETE, 0.5), (TrialState.PRUNED, 0.1), (TrialState.FAIL, None)]
    ):
        attrs = (
            {"best_step": 10 * number, "steps": 20, "peak_memory_mb": 100.5 + number}
            if value is not None
            else {"fail_reason": "exit 1\nlast lines"}
        )
        study.add_trial(
            optuna.trial.create_trial(
                state=state,
                value=value if state == TrialState.COMPLETE else None,
                params={"optim": "adamw", "optim.lr@adamw": 1e-3 * (number + 1)},
                distributions={"optim": optim, "optim.lr@adamw": lr},
                user_attrs=attrs,
                intermediate_values={10: value} if value is not None else {},
            )
        )
    assert status_main(["study=export", "format=csv", f"storage.url={url}"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["number"], r["state"]) for r in rows] == [("0", "COMPLETE"), ("1", "PRUNED"), ("2", "FAIL")]
    assert [r["optim.lr"] for r in rows] == ["0.001", "0.002", "0.003"] and all(r["optim"] == "adamw" for r in rows)
    assert rows[0]["value"] == "0.5" and rows[2]["value"] == "" and rows[2]["reason"] == "exit 1"
    assert [r["peak_memory_mb"] for r in rows] == ["100.5", "101.5", ""]  # each trial's peak (trm/measures/memory.py)

    frame = optuna.load_study(study_name="export", storage=url).trials_dataframe()  # needs pandas: the extra
    assert list(frame["number"]) == [0, 1, 2] and list(frame["state"]) == ["COMPLETE", "PRUNED", "FAIL"]
    assert float(frame["value"][0]) == pytest.approx(float(rows[0]["value"]))


@pytest.mark.parametrize("module", ["sweeps.run", "trm.train"])
def test_hydra_help_piped_into_a_reader_that_stops_early_ends_quietly(module: str) -> None:
    """Issue: `python -m sweeps.run --help | head` ended in a BrokenPipeError traceback (Hydra prints the help)."""
    proc = subprocess.Popen([sys.executable, "-m", module, "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the help is written (as `| head` once it has its lines)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err
