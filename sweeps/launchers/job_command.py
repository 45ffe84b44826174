"""The job command line: the overrides the driver puts after `python -m trm.train` for one job of a trial.

This is the contract between the driver and the job, in one place. The job reads it through conf/train.yaml
(`out_dir`, `checkpoint.url`, the `sweep:` block); launchers quote its literal values (LITERAL_KEYS) so that
names and paths reach the job unchanged; `python -m trm.train <training overrides>` re-trains a trial
(sweeps/best.py prints it from the `details` attribute).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sweeps.search.space import to_overrides

JOB_TAG_KEY = "sweep.job"  # the launcher's tag on every worker's command line (lets it find and stop them)


def stop_grace(kill_grace_s: float) -> str:
    """The override every launcher adds to its jobs: its SIGTERM-to-SIGKILL grace (launcher.kill_grace_s), so that a
    job's stop (save, upload) ends within it (trm/checkpointer.py) on every launcher, not only the pod's."""
    return f"checkpoint.stop_grace_s={kill_grace_s:g}"


# Overrides whose values the driver builds from names and paths (study.name, output_root, the storage URL): plain
# strings that must reach trm.train as they are, whatever characters they hold. Every other override is a Hydra
# expression the user wrote (trial.overrides, a sampled `optim.betas=[0.9,0.95]`) and passes untouched.
LITERAL_KEYS = (
    "out_dir",
    "checkpoint.url",
    "sweep.study",
    "sweep.study_uid",
    "sweep.storage",
    "sweep.password_env",
    JOB_TAG_KEY,
)


def job_name(study: str, study_uid: str, trial_number: int) -> str:
    """The launcher's name of a trial's job (JOB_TAG_KEY's value): the study's name, the first 8 of its uid, the
    trial number. The uid keeps it unique on shared machines: two studies of the same name (a laptop's SQLite and
    the team's PostgreSQL, or two tests at once) on one pod never match each other's cancel pattern."""
    return f"{study}-{study_uid[:8]}-{trial_number}"


def training_overrides(base: list[str], sampled: dict[str, Any], objective: str, direction: str) -> list[str]:
    """What a trial trains, and nothing about where: the study's fixed overrides, then the sampled values, then
    the objective the job tracks its best checkpoint by."""
    return [
        *base,
        *to_overrides(sampled),
        f"train.objective={objective}",
        f"train.objective_direction={direction.lower()}",
    ]


@dataclass(frozen=True)
class StudyLink:
    """The `sweep.*` keys: which study and trial the job reports to (trm/links/trial.py reads them)."""

    study: str
    study_uid: str
    trial_number: int
    storage: str  # a URL without a password: the job finds that in password_env or ~/.pgpass
    password_env: str | None = None
    seed_index: int | None = None  # set only when a trial trains several seeds (seed 0 alone reports to the pruner)
    sampled: tuple[str, ...] = ()  # the override keys the study sampled: the job's W&B run reads their values
    # A confirm job (sweeps/trials/confirm.py): the trial's configuration on this training seed, stored on the study.
    confirm_seed: int | None = None

    def overrides(self) -> list[str]:
        out = [
            f"sweep.study={self.study}",
            f"sweep.study_uid={self.study_uid}",
            f"sweep.trial_number={self.trial_number}",
            f"sweep.storage={self.storage}",
        ]
        if self.password_env:
            out.append(f"sweep.password_env={self.password_env}")
        if self.sampled:
            out.append("sweep.sampled=[" + ",".join(self.sampled) + "]")
        if self.seed_index is not None:
            out += [f"seed={self.seed_index}", f"sweep.seed_index={self.seed_index}"]
        if self.confirm_seed is not None:
            out += [f"seed={self.confirm_seed}", "sweep.confirm=true"]
        return out


@dataclass(frozen=True)
class JobCommand:
    """One job of a trial: what it trains, where it writes, what it reports to."""

    training: list[str]  # training_overrides(): the re-train command's arguments
    tracking: list[str]  # the study's W&B settings and the run id (sweeps.trials.wandb_summary.trial_wandb_overrides)
    out_dir: str
    checkpoint_url: str
    link: StudyLink
    extra: tuple[str, ...] = ()  # what the job's slot adds (sweeps.launchers.slots: the devices it trains on)

    def overrides(self) -> list[str]:
        return [
            *self.training,
            *self.tracking,
            f"out_dir={self.out_dir}",
            f"checkpoint.url={self.checkpoint_url}",
            *self.link.overrides(),
            *self.extra,
        ]
