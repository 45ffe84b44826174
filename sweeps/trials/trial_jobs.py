"""What one trial's jobs are before any of them runs: their directories and their command lines.

Built from the typed sweep config, the trials' base overrides, the storage URL and the study's uid, with no open
study: the dry run (sweeps/run.py) builds the same command lines the TrialRunner (sweeps/trials/trial_runner.py)
starts. A retry chain shares its first trial's checkpoints (`origin`); with several seeds each seed's job has its own
directories (sweeps/trials/paths.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sweeps.config.schema import SweepConfig
from sweeps.launchers.base import Launcher
from sweeps.launchers.job_command import JobCommand, StudyLink, training_overrides
from sweeps.launchers.slots import Slot
from sweeps.trials.paths import StudyRoots, TrialPaths
from sweeps.trials.retry import visible_here
from sweeps.trials.wandb_summary import trial_wandb_overrides


@dataclass(frozen=True)
class TrialJobs:
    """The directories and command lines of a study's trials; `roots` places every trial's directories."""

    sweep: SweepConfig
    base_overrides: tuple[str, ...]
    launcher: Launcher
    storage_url: str
    study_uid: str
    roots: StudyRoots

    @classmethod
    def of(
        cls, sweep: SweepConfig, base_overrides: Sequence[str], launcher: Launcher, storage_url: str, study_uid: str
    ) -> TrialJobs:
        """Trial directories: <root>/<study name>/<first 8 of the study's uid>/trial-<n> (sweeps.trials.paths)."""
        roots = StudyRoots.of(
            sweep.output_root, sweep.trial.run_root, sweep.trial.checkpoint_root, str(sweep.study.name), study_uid
        )
        return cls(sweep, tuple(base_overrides), launcher, storage_url, study_uid, roots)

    def training_overrides(self, sampled: dict[str, Any]) -> list[str]:
        """What a trial trains: pasted after `python -m trm.train` they re-train it (sweeps/best.py)."""
        return training_overrides(
            list(self.base_overrides), sampled, self.sweep.study.objective, self.sweep.study.direction
        )

    def checkpoint_url(self, origin: int) -> str:
        """A retry chain's checkpoints: under its first trial's directory."""
        return self.roots.checkpoint_url(origin)

    def visible_checkpoints(self, origin: int) -> str | None:
        """The retry chain's checkpoint directory where this machine can tell what is in it (sweeps.trials.retry)."""
        return visible_here(self.trial_paths(origin, origin).checkpoint_url, self.launcher.shares_filesystem)

    def trial_paths(self, number: int, origin: int, seed_index: int = 0) -> TrialPaths:
        """Where the job of seed `seed_index` of trial `number` writes (its own directories when seeds > 1)."""
        return self.roots.trial(number, origin, seed_index, self.sweep.study.seeds)

    def job_command(
        self,
        number: int,
        sampled: dict[str, Any],
        origin: int,
        seed_index: int = 0,
        slot: Slot | None = None,
        logged_through: int | None = None,
    ) -> JobCommand:
        """The job's command line for one seed of trial `number` on `slot` (sweeps/launchers/job_command.py); a retry's
        `logged_through` is the last step its chain logged (TrialRunner.chain_logged_through)."""
        paths = self.trial_paths(number, origin, seed_index)
        link = StudyLink(
            study=str(self.sweep.study.name),
            study_uid=self.study_uid,
            trial_number=number,
            storage=self.storage_url,
            password_env=self.sweep.storage.password_env or None,
            seed_index=seed_index if self.sweep.study.seeds > 1 else None,
            sampled=tuple(sampled),
        )
        return JobCommand(
            training=self.training_overrides(sampled),
            tracking=trial_wandb_overrides(self.sweep.wandb, self.study_uid, origin, seed_index, logged_through),
            out_dir=paths.run_dir,
            checkpoint_url=paths.checkpoint_url,
            link=link,
            extra=slot.overrides if slot else (),
        )
