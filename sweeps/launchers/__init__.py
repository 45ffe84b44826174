"""Launchers start one trial's training job on its workers; one `conf/launcher/*.yaml` each."""

from sweeps.launchers.base import JobHandle, JobSpec, Launcher, LauncherConfigError

__all__ = ["JobHandle", "JobSpec", "Launcher", "LauncherConfigError"]
