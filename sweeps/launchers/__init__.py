"""Launchers start one trial's training job on its workers; one `conf/launcher/*.yaml` each."""

from sweeps.launchers.base import JobSpec, Launcher, LauncherConfigError
from sweeps.launchers.workers import JobHandle

__all__ = ["JobHandle", "JobSpec", "Launcher", "LauncherConfigError"]
