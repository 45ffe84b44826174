"""The training config's schema (contracts/train_config.py): Hydra refuses a bad key, type or choice as it composes
conf/train.yaml, the schema's __post_init__ a bad range; each refusal names the key, the value and what is accepted,
for a job and for the driver's validation of its trials alike (both compose through compose_train_config)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import HydraException
from omegaconf import OmegaConf

from contracts.hydra_app import compose_train_config
from contracts.schema_checks import ConfigSchemaError
from contracts.train_config import TrainLoop

CONF = Path(__file__).resolve().parents[1] / "conf"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        # types and choices: Hydra, as it composes
        (["train.steps=abc"], r"^train.steps='abc': .*could not be converted to Integer"),
        (["train.loss=hinge"], r"^train.loss='hinge': .*expected one of \['stablemax', 'softmax'\]"),
        (["reeval.checkpoint=previous.pt"], r"^reeval.checkpoint='previous.pt': .*\['best.pt', 'latest.pt'\]"),
        (["train.stepz=5"], r"^train.stepz: Key 'stepz' not in 'TrainLoop'.*accepted: \[.*'steps'"),
        (["optim=lion", "optim.eps=1e-6"], r"^optim.eps: Key 'eps' not in 'OptimConfig'"),
        # ranges and relations: the dataclasses' __post_init__
        (["train.eval_batch_size=0"], r"^train.eval_batch_size=0: expected a whole number >= 1$"),
        (["train.objective=eval/acc"], r"^train.objective='eval/acc': expected one of \['eval/halted_examples'"),
        (["optim.lr=0"], r"^optim.lr=0: expected > 0$"),
        (["optim.lr=-1.23456789e-4"], r"^optim.lr=-0.000123456789: expected > 0$"),  # not rounded as :g would
        (["runtime.timeout_s=0"], r"^runtime.timeout_s=0: expected seconds > 0$"),
        (["optim.betas=[0.9,1.0]"], r"^optim.betas=\[0.9, 1.0\]: expected two values in \[0, 1\)$"),
        (["optim=adamw", "optim.eps=0"], r"^optim.eps=0: expected > 0$"),
        (["optim.warmup_steps=-1"], r"^optim.warmup_steps=-1: expected >= 0"),
        (["halting.exploration_prob=1.5"], r"^halting.exploration_prob=1.5: expected a probability in \[0, 1\]$"),
        (["curriculum=linear", "curriculum.stages=1"], r"^curriculum.stages=1: expected >= 2 for an enabled"),
        (["runtime.rank=2", "runtime.world_size=2"], r"^runtime.rank=2: expected < runtime.world_size=2$"),
        (["runtime.port=0"], r"^runtime.port=0: expected a TCP port in \[1, 65535\]$"),
        (["data.num_test=0"], r"^data.num_test=0: expected a whole number >= 1$"),
        (["sweep.report_retry.attempts=0"], r"^sweep.report_retry.attempts=0: expected a whole number >= 1$"),
    ],
)
def test_a_bad_value_is_refused_while_composing_naming_key_value_and_accepted(
    overrides: list[str], expected: str
) -> None:
    with pytest.raises(ConfigSchemaError, match=expected) as err:
        compose_train_config(overrides)
    # What the sweep's validation catches (a composition error) and what a bad value is (a ValueError).
    assert isinstance(err.value, HydraException) and isinstance(err.value, ValueError)
    assert "\n" not in str(err.value)  # one line: the driver shows the first line of a composition error


def test_what_the_trainer_accepts_still_composes() -> None:
    """The schema refuses nothing the trainer runs: true/false for compile, an eval interval past the last step
    (the last step evaluates anyway), a disabled curriculum's unread values, a preset's keys of another data option."""
    cfg = compose_train_config(["train.compile=true", "train.steps=5", "train.eval_interval=10"])
    assert cfg.train.compile is True and OmegaConf.get_type(cfg.train) is TrainLoop
    assert compose_train_config(["curriculum.stages=1"]).curriculum.stages == 1
    extreme = compose_train_config(["experiment=test_tiny", "data=sudoku_extreme", "data.path=x"]).data
    assert (extreme.source, extreme.num_train) == ("path", 200)  # test_tiny's size, unread by a path dataset


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))
def test_conf_gives_every_key_of_the_schema_a_value(experiment: str) -> None:
    """The values live in conf/ only (a schema field defaults to MISSING): each preset leaves nothing unset but a
    dataset's path, which a user gives."""
    cfg = compose_train_config([f"experiment={experiment}", "out_dir=run"])
    assert OmegaConf.missing_keys(cfg) <= {"data.path"}


@pytest.mark.slow
def test_the_job_refuses_a_range_before_it_trains(tmp_path: Path) -> None:
    """`python -m trm.train` composes through Hydra itself: its main checks the ranges first."""
    proc = subprocess.run(
        [sys.executable, "-m", "trm.train", "optim.lr=-1", f"out_dir={tmp_path}", f"hydra.run.dir={tmp_path}/h"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "optim.lr=-1: expected > 0" in proc.stderr  # as written, not -1.0
    assert not (tmp_path / "metrics.jsonl").exists()
