"""The sweep config's schema (conf/sweep.yaml and its groups), registered in Hydra's ConfigStore as `sweep_schema`.

conf/sweep.yaml lists `sweep_schema` first in its defaults, so every file and override composed onto it is checked
by OmegaConf at composition: a key nothing reads is refused (struct), a value of the wrong type is refused or
converted as OmegaConf converts ("5" to 5 for an int; `true` is no int). The values live in conf/; the fields
here are MISSING. What a type cannot say (a range, or a relation within one block such as grace_s > interval_s)
is each dataclass's `__post_init__`, run by sweeps.config.typed_config.typed_sweep (OmegaConf.to_object) before anything
runs.

The sampler, the pruner and the launcher are `_target_` nodes: open mappings here, checked by building them as the
driver does (sweeps/validation/validate_optuna.py, sweeps/launchers/base.py `build_launcher`). `storage.engine` is checked by
storage/engine_config.py (a trial's job reads the same file). Checks that span configs (the search space against
the training config, the batch against the slots, the interpreter, the output root) stay in sweeps/validation/validate.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from contracts.metric_names import EVAL_METRICS, MAXIMIZED, MINIMIZED, TRIAL_NUMBERS
from contracts.schema_checks import Checks
from contracts.wandb_runs import MODES
from storage import study_name
from sweeps.config.config_values import SweepConfigError
from sweeps.config.estimate import Utilization, UtilizationError

# OmegaConf reads these annotations at run time: Optional[...] (not `X | None`) is what it understands.
# ruff: noqa: UP045


# Each block's range checks refuse with SweepConfigError, the error the sweep's validation reports.
check = Checks(SweepConfigError)


@dataclass
class Objective:
    """One extra objective of a multi-objective study (`study.objectives`)."""

    name: str = MISSING
    direction: str = MISSING


@dataclass
class Study:
    """A study/*.yaml: what is searched, what is measured and how."""

    name: Any = MISSING  # checked by storage.study_name: a YAML number or bool is refused, not turned into 'True'
    objective: str = MISSING
    direction: str = MISSING
    prune_metric: Optional[str] = MISSING
    value: str = MISSING
    space: dict[str, Any] = MISSING  # per scale: {training key: range} (sweeps/search/space.py parses the ranges)
    conditional: dict[str, Any] = MISSING
    fixed: dict[str, list[str]] = MISSING
    baseline: dict[str, Any] = MISSING
    enqueue_baseline: bool = MISSING
    seeds: int = MISSING
    objectives: list[Objective] = MISSING
    allow_changed_definition: bool = MISSING

    def __post_init__(self) -> None:
        why = study_name.problem(self.name)
        if why is not None:
            shown = repr(self.name) if isinstance(self.name, str) else self.name
            raise SweepConfigError(f"study.name={shown}: {why}")
        for key, direction in (
            ("direction", self.direction),
            *((f"objectives[{i}].direction", o.direction) for i, o in enumerate(self.objectives)),
        ):
            check.one_of(f"study.{key}", str(direction).lower(), ("maximize", "minimize"))
        check.one_of("study.value", self.value, ("best", "last"))
        if self.objective not in EVAL_METRICS:
            raise SweepConfigError(
                f"study.objective={self.objective!r}: not a metric the trainer produces at its evals; expected one of {list(EVAL_METRICS)}"
            )
        for i, extra in enumerate(self.objectives):
            if extra.name not in (*TRIAL_NUMBERS, *EVAL_METRICS):
                raise SweepConfigError(
                    f"study.objectives[{i}].name={extra.name!r}: not a value a trial records; expected one of "
                    f"{list(TRIAL_NUMBERS)} (stored by the job) or an eval metric {list(EVAL_METRICS)}"
                )
        self._check_prune_metric()
        check.at_least("study.seeds", self.seeds, 1, what="an integer")

    def _check_prune_metric(self) -> None:
        """The pruner compares reported values in the study's direction: a metric reported in its place must be an
        eval metric that is better in that same direction (an accuracy for maximize, a loss for minimize)."""
        metric = self.prune_metric
        if metric is None:
            return
        if self.objectives:
            raise SweepConfigError(
                f"study.prune_metric={metric!r}: this study has several objectives and Optuna prunes single-objective studies only; remove it"
            )
        direction = self.direction.lower()
        accepted = [f"eval/{m}" for m in (MAXIMIZED if direction == "maximize" else MINIMIZED)]
        if metric not in accepted:
            raise SweepConfigError(
                f"study.prune_metric={metric!r}: for a study that is to {direction} expected null (the objective) or one of {accepted}"
            )


@dataclass
class Storage:
    """conf/storage/*.yaml: where the study lives (storage/url.py resolves a null URL)."""

    url: Optional[str] = MISSING
    password_env: Optional[str] = MISSING
    engine: dict[str, Any] = MISSING  # conf/storage/engine/default.yaml, checked by storage/engine_config.py


@dataclass
class Trial:
    """What every trial trains (`trial.overrides`, its train.steps the trial length) and where it writes."""

    overrides: list[str] = MISSING
    run_root: Optional[str] = MISSING
    checkpoint_root: Optional[str] = MISSING


@dataclass
class Heartbeat:
    interval_s: float = MISSING
    grace_s: float = MISSING
    max_retry: int = MISSING

    def __post_init__(self) -> None:
        for key, value in (("heartbeat.interval_s", self.interval_s), ("heartbeat.grace_s", self.grace_s)):
            whole = value is not None and value >= 1 and float(value).is_integer()
            check.require(key, value, whole, "a whole number of seconds >= 1 (Optuna's storage takes whole seconds)")
        check.at_least("heartbeat.max_retry", self.max_retry, 0, what="an integer")
        if self.grace_s <= self.interval_s:
            raise SweepConfigError(
                f"heartbeat.grace_s={self.grace_s:g} must exceed heartbeat.interval_s={self.interval_s:g}: "
                "a live driver's trials would look dead between two beats"
            )


@dataclass
class Draws:
    """No wasted draws (sweeps/search/distinct_draws.py)."""

    max_redraws: int = MISSING
    enumerate_share: Optional[float] = MISSING

    def __post_init__(self) -> None:
        check.at_least("draws.max_redraws", self.max_redraws, 0)
        share = self.enumerate_share
        check.require(
            "draws.enumerate_share", share, share is None or 0 < share <= 1, "a number in (0, 1], or null (never)"
        )


@dataclass
class ReevalSettings:
    """The top trials' checkpoints evaluated again at the study's end (sweeps/trials/reeval.py)."""

    at_end: bool = MISSING
    top_k: int = MISSING
    examples: Optional[int] = MISSING  # None: the whole test split

    def __post_init__(self) -> None:
        check.at_least("reeval.top_k", self.top_k, 1)
        check.at_least("reeval.examples", self.examples, 1, none="all")


@dataclass
class ConfirmSettings:
    """The top configurations trained again on fresh training seeds (sweeps/trials/confirm.py)."""

    at_end: bool = MISSING
    top_k: int = MISSING
    seeds: int = MISSING
    first_seed: int = MISSING
    own_variance_at: int = MISSING

    def __post_init__(self) -> None:
        check.at_least("confirm.top_k", self.top_k, 1)
        check.at_least("confirm.seeds", self.seeds, 1)
        check.at_least("confirm.first_seed", self.first_seed, 0)
        check.at_least("confirm.own_variance_at", self.own_variance_at, 2)


@dataclass
class Estimate:
    """The dry run's pricing inputs (sweeps/config/estimate.py)."""

    enabled: bool = MISSING
    peak_tflops: float = MISSING
    utilization: Any = MISSING  # a fraction, or {per-chip batch: fraction}: Utilization.parse
    pods: dict[str, int] = MISSING

    def __post_init__(self) -> None:
        check.require("estimate.peak_tflops", self.peak_tflops, self.peak_tflops > 0, "the chip's peak in TFLOP/s, > 0")
        try:
            Utilization.parse(self.utilization)
        except UtilizationError as err:
            raise SweepConfigError(str(err)) from None


@dataclass
class Backoff:
    """storage_outage_backoff: the driver's waits while the database does not answer."""

    first_s: float = MISSING
    max_s: float = MISSING

    def __post_init__(self) -> None:
        check.seconds("storage_outage_backoff.first_s", self.first_s)
        check.seconds("storage_outage_backoff.max_s", self.max_s)


@dataclass
class Preflight:
    """The pod preflight (sweeps/preflight.py)."""

    enabled: bool = MISSING
    timeout_s: float = MISSING
    reach_s: float = MISSING
    expect: Optional[dict[str, Optional[str]]] = MISSING
    chips_glob: Optional[str] = None  # None: the slice's chip family's (sweeps/launchers/tpu/slice.py: FAMILIES)
    min_free_gb: float = MISSING

    def __post_init__(self) -> None:
        check.seconds("preflight.timeout_s", self.timeout_s)
        check.seconds("preflight.reach_s", self.reach_s)
        check.at_least("preflight.min_free_gb", self.min_free_gb, 0, what="gigabytes")


@dataclass
class Wandb:
    """conf/wandb/default.yaml (shared with the trials) and the sweep's own summary keys."""

    enabled: bool = MISSING
    mode: str = MISSING
    project: Optional[str] = MISSING
    entity: Optional[str] = MISSING
    tags: list[str] = MISSING
    summary: bool = MISSING
    dir: Optional[str] = MISSING
    init_timeout_s: float = MISSING
    finish_timeout_s: float = MISSING

    def __post_init__(self) -> None:
        check.one_of("wandb.mode", self.mode, MODES)
        check.seconds("wandb.init_timeout_s", self.init_timeout_s)
        check.seconds("wandb.finish_timeout_s", self.finish_timeout_s)


@dataclass
class SweepConfig:
    """conf/sweep.yaml composed: `python -m sweeps.run`'s whole config."""

    study: Study = MISSING
    storage: Storage = MISSING
    launcher: dict[str, Any] = MISSING  # `_target_` nodes: built, and so checked, by sweeps/config/optuna_parts.py
    sampler: dict[str, Any] = MISSING
    pruner: dict[str, Any] = MISSING
    scale: str = MISSING
    n_trials: int = MISSING
    timeout: Optional[float] = MISSING
    max_concurrent: Optional[int] = MISSING
    dry_run: bool = MISSING
    seed: int = MISSING
    output_root: str = MISSING
    trial: Trial = MISSING
    heartbeat: Heartbeat = MISSING
    draws: Draws = MISSING
    reeval: ReevalSettings = MISSING
    confirm: ConfirmSettings = MISSING
    estimate: Estimate = MISSING
    storage_outage_backoff: Backoff = MISSING
    preflight: Preflight = MISSING
    stall_timeout_s: float = MISSING
    poll_s: float = MISSING
    progress_interval_s: float = MISSING
    wandb: Wandb = MISSING

    def __post_init__(self) -> None:
        check.at_least("n_trials", self.n_trials, 1, what="an integer")
        check.at_least("max_concurrent", self.max_concurrent, 1, none="one trial per slot", what="an integer")
        check.seconds("timeout", self.timeout, none="no limit")
        for key in ("stall_timeout_s", "poll_s", "progress_interval_s"):
            check.seconds(key, getattr(self, key))
        if self.scale not in self.study.space:
            raise SweepConfigError(
                f"scale={self.scale!r}: study {self.study.name!r} has ranges for {sorted(self.study.space)} only"
            )


SCHEMA_NAME = "sweep_schema"  # conf/sweep.yaml's first default


def register() -> None:
    """Store the schema where conf/sweep.yaml's defaults find it (idempotent: the entry is replaced)."""
    ConfigStore.instance().store(name=SCHEMA_NAME, node=SweepConfig, replace=True)


register()
