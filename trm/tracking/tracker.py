"""Experiment tracking on rank 0 (W&B): one run per training job. Other ranks never create a run.

`make_tracker` opens the run (its name, config and tags: trm/tracking/run_config.py; its id and mode:
contracts/wandb_runs.py). `wandb.run_id` (the driver passes `trial_run_id`: one per study, retry chain and
seed) opens the run with that id and `resume="allow"`, so a job resumed from its checkpoint continues the run
it started instead of adding one; without it W&B draws a random id. Metrics are logged against the training
step at the loop's log/eval points only; the summary holds the outcome, objective, best value and step,
parameter count and compute. The run directory is `<out_dir>/wandb/` unless `wandb.dir` says otherwise.
Tracking is never worth a training run: if wandb cannot be imported or a call fails, one warning is printed
and the job continues untracked.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contracts.hydra_app import TrainJob
from contracts.run_summary import RunSummary
from contracts.wandb_runs import default_project, finish_run, resolve_mode, run_settings
from trm.tracking.run_config import run_identity, run_summary, run_tags, safe_config, sampled_params, study_attributes

if TYPE_CHECKING:  # a type only: trm.precision imports torch, which this module does not need
    from trm.precision import Precision

_warned = False


def warn(message: str) -> None:
    """One warning per process: tracking problems must not drown the training log."""
    global _warned  # noqa: PLW0603 (one flag per process is the contract)
    if not _warned:
        _warned = True
        print(f"warning: W&B tracking is off for this run: {message}", file=sys.stderr, flush=True)


class Tracker:
    """No-op tracker: the interface the training loop calls (non-zero ranks, tracking disabled or broken)."""

    run: Any = None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def close(self, summary: RunSummary) -> None:
        pass


class WandbTracker(Tracker):
    """Rank 0's W&B run. Every call is guarded: a tracking error turns the tracker into a no-op."""

    def __init__(self, run: Any, logged_through_step: int | None = None):
        self.run = run
        self.finished = False
        # Steps the retry chain's earlier jobs logged already (wandb.logged_through_step): online W&B drops a step
        # it has, but offline each job writes its own file and `wandb sync` would upload both.
        self.logged_through = -1 if logged_through_step is None else int(logged_through_step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.run is None or step <= self.logged_through:
            return
        try:
            self.run.log({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}, step=int(step))
        except Exception as err:  # noqa: BLE001 - tracking never stops training
            self._give_up(err)

    def close(self, summary: RunSummary) -> None:
        if self.run is None or self.finished:
            return
        self.finished = True
        try:
            self.run.summary.update(run_summary(summary))
            if summary.outcome == "PREEMPTED":  # stopped by SIGTERM with a checkpoint; a retry resumes
                self.run.mark_preempting()
            finish_run(self.run, exit_code=1 if summary.outcome == "FAIL" else 0)
        except Exception as err:  # noqa: BLE001 - tracking never fails a run: one warning
            self._give_up(err)
        self.run = None

    def _give_up(self, err: BaseException) -> None:
        warn(f"{type(err).__name__}: {err}")
        run, self.run = self.run, None
        with contextlib.suppress(Exception):
            run.finish(exit_code=1)


# --------------------------------------------------------------------------------------------- factory


def make_tracker(
    job: TrainJob, is_main: bool, extra: dict[str, Any] | None = None, precision: Precision | None = None
) -> Tracker:
    """The tracker for this process: a W&B run on rank 0 when enabled in config, else a no-op. `precision`: what
    `train.precision` resolved to (the run's config shows that mode, not `auto`, and the reason beside it).
    `wandb` is a dict (contracts/train_config.py TrainApp): its keys are conf/wandb/default.yaml's and
    conf/train.yaml's, read as they are."""
    if not is_main:
        return Tracker()  # other ranks never import wandb, let alone create a run
    cfg, wcfg = job.app, job.app.wandb
    if not wcfg["enabled"]:
        return Tracker()
    try:
        mode = resolve_mode(wcfg["mode"])
    except ValueError as err:
        warn(str(err))
        return Tracker()
    if mode == "disabled":
        return Tracker()
    params = sampled_params(job)
    study_attrs: dict[str, Any] = {}
    if cfg.sweep.study is not None and cfg.sweep.storage:
        try:
            study_attrs = study_attributes(cfg.sweep)
        except Exception as err:  # noqa: BLE001 - the run is still worth having without them
            print(
                f"warning: W&B run without the study's tags (cannot read the study: {type(err).__name__}: {err})",
                file=sys.stderr,
                flush=True,
            )
    try:
        import wandb

        run_dir = Path(str(wcfg["dir"] or cfg.out_dir)).resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        config = safe_config(job.written)
        if precision is not None and isinstance(config.get("train"), dict):
            config["train"].update(precision=precision.mode, precision_reason=precision.reason)
        config["trial_params"] = params
        config["model"] = dict(extra or {})
        settings = run_settings(
            init_timeout_s=wcfg["init_timeout_s"],  # conf/wandb/default.yaml
            finish_timeout_s=wcfg["finish_timeout_s"],
            console=wcfg["console"],  # conf/train.yaml
            system_metrics=wcfg["system_metrics"],
        )
        run_id = wcfg["run_id"]
        run = wandb.init(
            project=str(wcfg["project"] or default_project()),
            entity=wcfg["entity"],
            id=str(run_id) if run_id else None,
            resume="allow" if run_id else None,  # the same id continues that run (offline: docs/usage.md, W&B)
            dir=str(run_dir),
            mode=mode,
            config=config,
            tags=run_tags(cfg, study_attrs),
            settings=settings,
            reinit="create_new",
            **run_identity(cfg),
        )
    except Exception as err:  # noqa: BLE001 - ImportError, bad settings, a stuck service: train untracked
        warn(f"{type(err).__name__}: {err}")
        return Tracker()
    return WandbTracker(run, wcfg["logged_through_step"])
