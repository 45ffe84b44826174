"""The study on W&B: one `study-summary` run per study, and the W&B settings the trials get.

    log_study_summary(study, sweep) one run (group = study name, job type `study-summary`) holding a
                                    wandb.Table of every trial: number, state, value, parameters, best step,
                                    model size, compute, its re-evaluation and its confirmed mean; the summary
                                    has the counts of trained trials and the best trial: the confirmed winner
                                    where the stage ran (sweeps/trials/confirmed.py: `confirm/ranking`,
                                    `confirm/tie`), else the re-evaluated one (`reeval/ranking`, `reeval/overlap`).
                                    Its id comes from the study's uid (`summary_run_id`) with resume="allow",
                                    so each driver start of the study updates the same run.
    trial_wandb_overrides(sweep.wandb, uid, origin, seed_index)
                                    the sweep's `wandb:` block as training overrides (`wandb.project=...`),
                                    so trials and the summary run land in the same project, and the trial's
                                    run id (`wandb.run_id`, `trial_run_id`: a retry continues its chain's run).

Same rules as the trials' tracking (contracts/wandb_runs.py): offline unless W&B finds a key, files under the
study's output directory, and a tracking failure is one warning, never a failed sweep.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from contracts.wandb_runs import (
    default_project,
    finish_run,
    resolve_mode,
    run_settings,
    summary_run_id,
    trial_run_id,
)
from storage.record import (
    FAIL_REASON_ATTR,
    SEED_STD_ATTR,
    SEED_VALUES_ATTR,
    Reeval,
    reevals,
    samples_per_s,
    trained_trials,
)
from storage.study_record import StudyAttrs
from storage.trial_record import TrialOutcome
from sweeps.config.schema import SweepConfig, Wandb
from sweeps.trials.confirm_rank import interval as confirm_interval
from sweeps.trials.confirm_rank import tie_line
from sweeps.trials.confirmed import confirmed_ranking, confirmed_rows, trials_winner
from sweeps.trials.reeval import interval, overlap_line, ranking, ranking_rows

JOB_TYPE = "study-summary"
# Trial user attributes copied into the table under their names (written by the job's trial link and the driver).
OUTCOME_COLUMNS = TrialOutcome.names_of(lambda o: (o.outcome, o.best_step, o.steps, o.params_count, o.compute_flops))
ATTR_COLUMNS = (*OUTCOME_COLUMNS, SEED_STD_ATTR, FAIL_REASON_ATTR)
BASE_COLUMNS = [
    "number",
    "state",
    "value",
    "values",
    "params",
    "duration_s",
    "seed_values",
    *ATTR_COLUMNS,
    "samples_per_s",
    "reeval_value",  # the re-evaluation's value, standard error and test puzzles (sweeps/trials/reeval.py)
    "reeval_stderr",
    "reeval_examples",
    "confirmed_mean",  # the configuration's mean over seeds and its standard error (sweeps/trials/confirmed.py)
    "confirmed_se",
]


def trial_wandb_overrides(
    w: Wandb,
    study_uid: str | None = None,
    origin: int | None = None,
    seed_index: int = 0,
    logged_through: int | None = None,
) -> list[str]:
    """Training overrides carrying the sweep's `wandb:` block to a trial (what differs from the trial's defaults, and
    the init timeout), and with the study's uid and the trial's retry-chain origin, its run id (`wandb.run_id`) and,
    for a retry, the last step its chain's earlier jobs logged (`wandb.logged_through_step`).

    Both apps take the defaults of these keys from one file (conf/wandb/default.yaml); the copy is still needed for
    what a sweep changes (`sweeps.run wandb.project=mine`), which the trials' own composition cannot see."""
    out = []
    if not w.enabled:
        out.append("wandb.enabled=false")
    elif study_uid is not None and origin is not None:
        out.append(f"wandb.run_id={trial_run_id(study_uid, origin, seed_index)}")
        if logged_through is not None:  # a retry: its chain's earlier jobs logged these steps to that run
            out.append(f"wandb.logged_through_step={int(logged_through)}")
    out.append(f"wandb.init_timeout_s={w.init_timeout_s:g}")  # a number: no neutral value to leave out
    out.append(f"wandb.finish_timeout_s={w.finish_timeout_s:g}")
    if w.mode != "auto":
        out.append(f"wandb.mode={w.mode}")
    if w.project:
        out.append(f"wandb.project={w.project}")
    if w.entity:
        out.append(f"wandb.entity={w.entity}")
    tags = w.tags
    if tags:
        out.append("wandb.tags=[" + ",".join("'" + str(t).replace("'", "") + "'" for t in tags) + "]")
    return out


def _column(values: list[Any]) -> list[Any]:
    """One parameter column with a single W&B type: floats when every value is a number, else strings."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return [None if v is None else float(v) for v in values]
    return [None if v is None else (v if isinstance(v, str) else json.dumps(v)) for v in values]


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def trial_rows(
    trials: list[FrozenTrial],
    reevaluated: dict[int, Reeval] | None = None,
    confirmed: dict[int, dict[str, Any]] | None = None,
) -> tuple[list[str], list[list[Any]]]:
    """Table columns and rows: fixed columns, then one `param/<name>` column per parameter seen in the study."""
    names = sorted({name for t in trials for name in t.params})
    reevaluated, confirmed = reevaluated or {}, confirmed or {}
    rows = []
    for t in trials:
        duration = (
            (t.datetime_complete - t.datetime_start).total_seconds()
            if t.datetime_complete and t.datetime_start
            else None
        )
        attrs = t.user_attrs
        row: list[Any] = [
            t.number,
            t.state.name,
            _finite(t.values[0]) if t.values else None,
            json.dumps(t.values) if t.values and len(t.values) > 1 else None,
            json.dumps(t.params, sort_keys=True, default=str),
            round(duration, 2) if duration is not None else None,
            json.dumps(attrs[SEED_VALUES_ATTR]) if attrs.get(SEED_VALUES_ATTR) is not None else None,
        ]
        for key in ATTR_COLUMNS:
            value = attrs.get(key)
            row.append(str(value)[:500] if key == FAIL_REASON_ATTR and value is not None else _finite(value))
        row.append(_finite(samples_per_s(attrs)))  # the job's measured step speed (details: throughput)
        again = reevaluated.get(t.number)
        row += [again.value, again.stderr, again.examples] if again else [None, None, None]
        mine = confirmed.get(t.number)
        row += [mine["mean"], mine["se"]] if mine else [None, None]
        rows.append(row)
    param_columns = [_column([t.params.get(n) for t in trials]) for n in names]
    for i, row in enumerate(rows):
        row.extend(col[i] for col in param_columns)
    # Columns of one type each: numbers as floats (None where missing), the rest as given.
    columns = [*BASE_COLUMNS, *(f"param/{n}" for n in names)]
    for j in range(2, len(BASE_COLUMNS)):
        col = [r[j] for r in rows]
        if all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in col):
            for r in rows:
                r[j] = None if r[j] is None else float(r[j])
        else:
            for r in rows:
                r[j] = None if r[j] is None else str(r[j])
    return columns, rows


def study_summary(study: optuna.Study) -> dict[str, Any]:
    """Counts of the trials that trained (storage.record.trained_trials), and the best trial: the confirmed winner
    where the top configurations were trained again on fresh seeds (sweeps/trials/confirm.py), else the re-evaluated
    winner where the study's top trials were evaluated again, with each ranking and its intervals."""
    trials = trained_trials(study.get_trials(deepcopy=False))
    out: dict[str, Any] = {f"count/{s.name.lower()}": sum(t.state == s for t in trials) for s in TrialState}
    out["count/total"] = len(trials)
    if len(study.directions) == 1:
        ranked = ranking(study)
        if ranked:
            out["reeval/ranking"] = ranking_rows(ranked)
            out["reeval/winner"] = f"trial {ranked[0].trial.number}: {interval(ranked[0].reeval)}"
            out["reeval/overlap"] = overlap_line(ranked)
        confirmed = confirmed_ranking(study)
        if confirmed:
            own = trials_winner(study)
            out["confirm/ranking"] = confirmed_rows(study)
            out["confirm/winner"] = f"trial {confirmed[0].trial}: {confirm_interval(confirmed[0])}"
            out["confirm/tie"] = tie_line(confirmed)
            out["confirm/differs_from_trials_winner"] = own is not None and own.number != confirmed[0].trial
        try:
            numbers = {t.number: t for t in study.get_trials(deepcopy=False)}
            best = numbers[confirmed[0].trial] if confirmed else ranked[0].trial if ranked else study.best_trial
            out.update(
                {
                    "best/number": best.number,
                    "best/value": best.value,
                    "best/params": best.params,
                    "best/step": TrialOutcome.of(best.user_attrs).best_step,
                    "best/reeval": next((r.reeval.as_dict() for r in ranked if r.trial.number == best.number), None),
                }
            )
        except ValueError:
            pass
    else:
        out["pareto/numbers"] = [t.number for t in study.best_trials]
    return out


def log_study_summary(study: optuna.Study, sweep: SweepConfig) -> Path | None:
    """Log one `study-summary` run for `study`; returns its run directory, or None when disabled or failed."""
    w = sweep.wandb
    if not w.enabled or not w.summary:
        return None
    try:
        mode = resolve_mode(w.mode)
        if mode == "disabled":
            return None
        import wandb

        root = Path(w.dir or Path(sweep.output_root) / study.study_name).resolve()
        root.mkdir(parents=True, exist_ok=True)
        trials = trained_trials(study.get_trials(deepcopy=False))
        confirmed_by_trial = {row["trial"]: row for row in confirmed_rows(study)}
        columns, rows = trial_rows(trials, reevals(study.user_attrs), confirmed_by_trial)
        attrs = StudyAttrs.of(study.user_attrs)
        facts = StudyAttrs(  # the run's config: the study's facts that say what it searched and how
            objective=attrs.objective,
            objectives=attrs.objectives,
            sampler=attrs.sampler,
            launcher=attrs.launcher,
            pruner=attrs.pruner,
            scale=attrs.scale,
        )
        config: dict[str, Any] = {
            "study": study.study_name,
            "directions": [d.name.lower() for d in study.directions],
            **facts.as_attrs(),
            "n_trials": sweep.n_trials,
        }
        uid = attrs.uid  # set by the driver when it opens the study
        tags = [f"study:{study.study_name}"]
        for key, spec in (
            ("sampler", attrs.sampler),
            ("pruner", attrs.pruner.get("_target_") if isinstance(attrs.pruner, dict) else attrs.pruner),
            ("launcher", attrs.launcher),
        ):
            if spec:
                tags.append(f"{key}:{str(spec).rsplit('.', 1)[-1]}"[:64])
        tags += [t[:64] for t in w.tags]
        run = wandb.init(
            project=w.project or default_project(),
            entity=w.entity,
            id=summary_run_id(uid) if uid else None,
            resume="allow" if uid else None,  # a restarted driver updates this study's run
            group=study.study_name,
            name=f"{study.study_name}-summary",
            job_type=JOB_TYPE,
            dir=str(root),
            mode=mode,
            config=config,
            tags=list(dict.fromkeys(tags)),
            settings=run_settings(init_timeout_s=w.init_timeout_s, finish_timeout_s=w.finish_timeout_s),
            reinit="create_new",
        )
        try:
            run.log({"trials": wandb.Table(columns=list[str | int](columns), data=rows)})
            run.summary.update(study_summary(study))
            run_dir = Path(run.dir).parent
        finally:
            finish_run(run)
        return run_dir
    except Exception as err:  # noqa: BLE001 - the study is done; its W&B summary is a bonus
        print(
            f"warning: no W&B study summary for {study.study_name}: {type(err).__name__}: {err}",
            file=sys.stderr,
            flush=True,
        )
        return None
