"""Where one job of a trial writes: built from typed parts, not by editing override strings.

A trial's run directory is per trial number; its checkpoints belong to its retry chain's first trial (the
origin) so a retry resumes them; with several seeds each seed has its own run and checkpoint directories.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import fsspec

log = logging.getLogger("sweeps")


def url_exists(url: str) -> bool | None:
    """Whether a file is at `url` (a path, or a store's URL: gs://...); None when that cannot be told (the store
    unreachable, its filesystem not installed)."""
    try:
        fs, path = fsspec.core.url_to_fs(url)
        return bool(fs.exists(path))
    except Exception as err:  # noqa: BLE001 (any store's error: the caller says it is not known)
        log.debug("could not look at %s: %s", url, err)
        return None


@dataclass(frozen=True)
class StudyRoots:
    """A study's roots: <root>/<study name>/<first 8 of the study's uid>. The uid keeps a new study under an old
    name (a new storage, a deleted study) out of the old study's directories."""

    output_root: Path  # this machine's trial directories (logs, the driver's view)
    run_root: str  # where the workers write their runs (a remote path on a pod)
    checkpoint_root: str  # where checkpoints go (a gs:// URL on a pod)

    @classmethod
    def of(
        cls, output_root: str, run_root: str | None, checkpoint_root: str | None, study: str, uid: str
    ) -> StudyRoots:
        study_dir = f"{study}/{uid[:8]}"
        local = Path(output_root).resolve() / study_dir
        # A root written with a trailing slash (gs://bucket/) is the same place: no `//` in the paths.
        runs = f"{run_root.rstrip('/')}/{study_dir}" if run_root else str(local)
        checkpoints = f"{checkpoint_root.rstrip('/')}/{study_dir}" if checkpoint_root else runs
        return cls(local, runs, checkpoints)

    def workdir(self, number: int) -> Path:
        """A trial's local working directory."""
        return self.output_root / f"trial-{number}"

    def checkpoint_url(self, origin: int) -> str:
        """A retry chain's checkpoints: under its first trial's directory."""
        return f"{self.checkpoint_root}/trial-{origin}/checkpoints"

    def trial(self, number: int, origin: int, seed_index: int = 0, seeds: int = 1) -> TrialPaths:
        return TrialPaths(self, number, origin, seed_index, seeds)


@dataclass(frozen=True)
class TrialPaths:
    """One job's directories: trial `number`, retry chain `origin`, seed `seed_index` of `seeds`."""

    roots: StudyRoots
    number: int
    origin: int
    seed_index: int = 0
    seeds: int = 1

    @property
    def _seed_dir(self) -> str:
        return f"/seed-{self.seed_index}" if self.seeds > 1 else ""

    @property
    def run_dir(self) -> str:
        return f"{self.roots.run_root}/trial-{self.number}{self._seed_dir}/run"

    @property
    def checkpoint_url(self) -> str:
        return f"{self.roots.checkpoint_root}/trial-{self.origin}{self._seed_dir}/checkpoints"

    @property
    def workdir(self) -> Path:
        base = self.roots.workdir(self.number)
        return base / f"seed-{self.seed_index}" if self.seeds > 1 else base
