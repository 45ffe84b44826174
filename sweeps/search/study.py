"""Open a sweep's Optuna study and check that it is the study this config asks for.

Separate from the driver's loop: opening decides what may be resumed (same objectives, directions and pruner
metric), records the study's facts for the dashboards and jobs, and gives each driver of a study its own seed.
"""

from __future__ import annotations

import logging
import uuid
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
from optuna.storages import RDBStorage
from optuna.study import StudyDirection

from storage import engine_settings, exclusive, open_storage, retry_callback
from storage.study_record import StudyAttrs
from sweeps.config.optuna_parts import build, pruner_spec, resolved_dict
from sweeps.config.schema import Study, SweepConfig
from sweeps.search.definition import (
    ALLOW_KEY,
    StudyDefinitionError,
    StudyMismatchError,
    objective_names,
    refusal,
    study_changes,
    study_directions,
)

log = logging.getLogger("sweeps")


def quiet_optuna_warnings() -> None:
    """Optuna warns on every ask() once heartbeats are on (they are meant for study.optimize); the driver
    records them itself, which is what the warning asks for. Its experimental-API warnings are noise here too."""
    warnings.filterwarnings("ignore", message=".*Heartbeat of storage is supposed to be used with Study.optimize.*")
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


class StudyNotOpenError(RuntimeError):
    """The driver was asked for its study (or storage) before open_study()."""


@dataclass(frozen=True)
class OpenStudy:
    """A study opened for this driver: its storage, the study, its uid and this driver's start order."""

    storage: RDBStorage
    study: optuna.Study
    uid: str
    driver_index: int


def reported_metric(study_cfg: Study) -> str:
    """What the trials report to the pruner at each eval (study.prune_metric, else the objective)."""
    return study_cfg.prune_metric or study_cfg.objective


def _check_matches(study: optuna.Study, study_cfg: Study) -> None:
    stored, name = StudyAttrs.of(study.user_attrs), study_cfg.name
    objectives, directions = objective_names(study_cfg), study_directions(study_cfg)
    if stored.objective not in (None, study_cfg.objective) or stored.objectives not in (None, objectives):
        raise StudyMismatchError(
            f"study.name={name!r} already exists with objective(s) {stored.objectives} "
            f"but this config asks for {objectives}: choose another study.name"
        )
    reported = reported_metric(study_cfg)
    if stored.prune_metric not in (None, reported) and study.get_trials(deepcopy=False):
        raise StudyMismatchError(
            f"study.name={name!r} already has trials that reported {stored.prune_metric!r} to the "
            f"pruner but this config reports {reported!r} (study.prune_metric): the pruner would compare the two; "
            "choose another study.name or the same prune_metric"
        )
    if [d.name.lower() for d in study.directions] != [d.lower() for d in directions]:
        raise StudyMismatchError(
            f"study.name={name!r} already exists with direction(s) "
            f"{[d.name.lower() for d in study.directions]} but this config asks for {directions}: choose another study.name"
        )


def _check_definition(study: optuna.Study, definition: Mapping[str, Any], allowed: bool) -> None:
    """Refuse a study stored with another definition (sweeps/search/definition.py), before anything is asked or written.
    A study from before definitions were stored is checked against its trials' distributions."""
    found = study_changes(StudyAttrs.of(study.user_attrs).definition, study.get_trials(deepcopy=False), definition)
    why = refusal(study.study_name, found, allowed)
    if why:
        raise StudyDefinitionError(why)
    if found:
        log.warning(
            "study %r continues with a changed definition (%s=true): %s",
            study.study_name,
            ALLOW_KEY,
            "; ".join(map(str, found)),
        )


def open_study(
    sweep: SweepConfig,
    storage_url: str,
    train_steps: int,
    definition: Mapping[str, Any] | None = None,
) -> OpenStudy:
    """Create or load the configured study, check it, record its facts; raise StudyMismatchError (or
    StudyDefinitionError, against `definition`: sweeps/search/definition.py) if it differs. `sweep` is what it reads and
    what it builds the sampler and the pruner from (`_target_` dicts, instantiated by Hydra); it records their
    targets and the launcher's."""
    study_cfg, hb = sweep.study, sweep.heartbeat
    storage = open_storage(
        storage_url,
        password_env=sweep.storage.password_env,
        heartbeat_interval=int(hb.interval_s),
        grace_period=int(hb.grace_s),
        failed_trial_callback=retry_callback(hb.max_retry),
        **engine_settings(sweep.storage.engine, "storage.engine"),
    )
    study = optuna.create_study(
        study_name=str(study_cfg.name),
        storage=storage,
        sampler=build(sweep.sampler),
        pruner=build(pruner_spec(sweep.pruner, train_steps)),  # as the jobs build it: lengths in steps
        directions=[StudyDirection[str(d).upper()] for d in study_directions(study_cfg)],
        load_if_exists=True,
    )
    _check_matches(study, study_cfg)
    if definition is not None:
        _check_definition(study, definition, study_cfg.allow_changed_definition)
    objectives = objective_names(study_cfg)
    StudyAttrs(
        objective=study_cfg.objective,
        objectives=objectives,
        pruner=pruner_spec(sweep.pruner, train_steps),
        prune_metric=reported_metric(study_cfg),
        sampler=str(sweep.sampler["_target_"]).rsplit(".", 1)[-1],
        launcher=str(sweep.launcher["_target_"]).rsplit(".", 1)[-1],
        scale=sweep.scale,
        definition=dict(definition) if definition is not None else None,
    ).store(study.set_user_attr, study.user_attrs)
    if study.metric_names != objectives:
        study.set_metric_names(objectives)  # optuna-dashboard and the CLI say eval/exact_accuracy, not "Objective 0"
    with exclusive(storage, f"uid:{study_cfg.name}"):  # two drivers opening a new study agree
        known = StudyAttrs.of(study.user_attrs)
        uid = known.uid or uuid.uuid4().hex
        driver_index = int(known.drivers or 0)
        StudyAttrs(uid=uid, drivers=driver_index + 1).store(study.set_user_attr, study.user_attrs)
    if driver_index:
        # A restarted or second driver with the study's seed would draw the first driver's parameters again:
        # each driver of a study gets its own seed, derived from the configured one and its start order.
        seed = int(np.random.SeedSequence([sweep.seed, driver_index]).generate_state(1)[0])
        study.sampler = build({**resolved_dict(sweep.sampler), "seed": seed})
        log.info("driver %d of this study: sampler seed %d (from seed=%s)", driver_index, seed, sweep.seed)
    return OpenStudy(storage, study, str(uid), driver_index)
