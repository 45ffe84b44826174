"""A W&B run's identity and mode, shared by a trial's job (trm/tracking.py) and the driver's study-summary run
(sweeps/wandb_summary.py), so both sides name the same run the same way.

W&B never touches the network unless asked to: `wandb.mode=auto` is `online` only when `WANDB_API_KEY` is set
(and `WANDB_MODE` does not say offline/disabled), else `offline` (upload later with `wandb sync <run dir>`)."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any, Literal, cast

from contracts.hydra_app import packaged_yaml

MODES = ("auto", "offline", "online", "disabled")
Mode = Literal["offline", "online", "disabled"]  # what `auto` resolves to, and what wandb.init takes


@functools.cache
def default_project() -> str:
    """The W&B project of a run whose config names none (`wandb.project=null`): conf/wandb/default.yaml's, the
    one both apps compose, read from the config package rather than repeated here."""
    return str(packaged_yaml("wandb/default.yaml")["project"])


def resolve_mode(mode: str | None, environ: Mapping[str, str] = os.environ) -> Mode:
    """`auto`: online only with an API key in the environment (and no WANDB_MODE=offline/disabled), else offline."""
    mode = (mode or "auto").lower()
    if mode not in MODES:
        raise ValueError(f"wandb.mode={mode!r}: expected one of {list(MODES)}")
    if mode != "auto":
        return cast(Mode, mode)  # one of MODES other than auto: checked above
    env_mode = (environ.get("WANDB_MODE") or "").lower()
    if env_mode in ("offline", "dryrun"):
        return "offline"
    if env_mode == "disabled":
        return "disabled"
    return "online" if environ.get("WANDB_API_KEY") else "offline"


def trial_run_id(study_uid: str, origin: int, seed_index: int = 0) -> str:
    """The W&B run id of a sweep trial's job: `<study uid[:12]>-t<origin>-s<seed index>`.

    One id per retry chain (`origin`: its first trial, whose checkpoints every retry resumes) and seed, so a
    retry continues its chain's run; the study's random uid keeps a new study under an old name from resuming
    an old study's runs (W&B ids are unique per project, and a deleted run's id cannot be used again)."""
    return f"{str(study_uid)[:12]}-t{int(origin)}-s{int(seed_index)}"


def summary_run_id(study_uid: str) -> str:
    """The W&B run id of a study's `study-summary` run: every driver start of the study updates that one run."""
    return f"{str(study_uid)[:12]}-summary"


def finish_run(run: Any, exit_code: int = 0) -> None:
    """Finish `run` and, when no other W&B run is active in this process, stop the W&B service.

    In offline mode `run.finish()` can return before the service has written the end of the run log; the
    atexit hook flushes it when the process ends, but a run read back (or synced) right away needs the
    teardown."""
    import wandb

    run.finish(exit_code=exit_code)
    if wandb.run is None:
        wandb.teardown()
