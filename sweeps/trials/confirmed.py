"""The confirmed ranking of a study, read from its records: every reader's one ranking where the confirm stage ran
(sweeps/trials/confirm.py trains, storage/confirm_record.py holds, sweeps/trials/confirm_rank.py computes).

A confirmed configuration's values are its trial's own (each seed it trained: the value the trial reported, or with
study.seeds > 1 each seed's) and its confirm seeds' (their best or last eval, as study.value says), each with its
eval's binomial standard error. Where the study was re-evaluated on more puzzles (sweeps/trials/reeval.py), the
stage re-evaluates each confirm seed the same way and the ranking takes those values, once every value of every
confirmed configuration has one on the same count; until then all are the trials' own eval: one eval for the
whole ranking. The re-evaluation chose which configurations were confirmed; the winner is the confirmed one.
"""

from __future__ import annotations

import math
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from contracts.eval_noise import binomial_stderr
from contracts.metric_names import HALTED_EXAMPLES, MAXIMIZED
from storage.confirm_record import (
    COMPLETE,
    CONFIRM_STAGE_ATTR,
    ConfirmSeed,
    ConfirmStage,
    confirmations,
)
from storage.record import SEED_VALUES_ATTR, Reeval, reevals
from storage.study_record import StudyAttrs
from storage.trial_record import TrialOutcome
from sweeps.search.space import params_to_values, to_overrides
from sweeps.trials.confirm_rank import Confirmed, SeedValue, interval, rank, tie_line
from sweeps.trials.reeval import interval as reeval_interval
from sweeps.trials.reeval import maximizing, ranking

SHARES = tuple(f"eval/{name}" for name in MAXIMIZED)  # objectives that are a share of puzzles: binomial noise
POOL_ALWAYS = 1 << 30  # no ConfirmStage stored: every configuration takes the pooled seed variance


def study_rule(study: optuna.Study) -> tuple[bool, int]:
    """How the study measures a trial (its definition, sweeps/search/definition.py): (its best eval's value rather
    than its last, how many seeds each trial trained); a study stored before they were recorded: (best, 1)."""
    definition = StudyAttrs.of(study.user_attrs).definition
    definition = definition if isinstance(definition, dict) else {}
    return definition.get("value", "best") != "last", int(definition.get("seeds") or 1)


def eval_se(metric: str, value: float, examples: Any) -> float | None:
    """The eval's standard error of a value measured on `examples` puzzles; None for a metric that is no share, or
    a count not recorded."""
    if metric not in SHARES or not isinstance(examples, (int, float)) or examples < 1:
        return None
    return binomial_stderr(value, int(examples))


def own_values(trial: FrozenTrial, metric: str) -> list[SeedValue]:
    """The trial's own trainings: each seed's value where it trained several (SEED_VALUES_ATTR), else its value."""
    examples = TrialOutcome.of(trial.user_attrs).final_metrics.get(f"eval/{HALTED_EXAMPLES}")
    per_seed = trial.user_attrs.get(SEED_VALUES_ATTR)
    values = [float(v) for v in per_seed] if isinstance(per_seed, list) and per_seed else [float(trial.value or 0.0)]
    return [SeedValue(v, eval_se(metric, v, examples), None, "trial") for v in values]


def confirm_value(record: ConfirmSeed, use_best: bool) -> SeedValue | None:
    """A confirm seed's value as the study measures a trial's; None for a failure or no finite value."""
    value = record.value(use_best)
    if record.outcome != COMPLETE or value is None or not math.isfinite(value):
        return None
    return SeedValue(float(value), eval_se(record.metric, float(value), record.examples), record.seed, "confirm")


def reevaluated_values(
    trial: FrozenTrial, reeval: Reeval | None, seeds: list[ConfirmSeed], study_seeds: int
) -> tuple[list[SeedValue], int] | None:
    """The configuration's values on the re-evaluation's larger eval, and its puzzles: its trial's (one seed) and each
    confirm seed's, all on one count; None where any of them lacks one (or a count differs)."""
    if study_seeds > 1 or reeval is None or reeval.failed is not None:
        return None  # a trial's later seeds are never re-evaluated
    if any(r.reeval_value is None or r.reeval_examples != reeval.examples for r in seeds):
        return None
    values = [SeedValue(reeval.value, reeval.stderr, None, "trial")]
    values += [
        SeedValue(float(r.reeval_value or 0.0), eval_se(r.metric, float(r.reeval_value or 0.0), r.reeval_examples),
                  r.seed, "confirm")
        for r in seeds
    ]  # fmt: skip
    return values, reeval.examples


def _values(study: optuna.Study) -> tuple[dict[int, list[SeedValue]], int | None]:
    """{trial number: its values} for every COMPLETE trial with a confirm seed done, and the eval they are on: the
    re-evaluation's puzzles where every value of every configuration has one on the same count (one eval for the
    whole ranking: a subset and the whole split differ in difficulty), else None: the trials' own eval."""
    use_best, study_seeds = study_rule(study)
    metric = str(StudyAttrs.of(study.user_attrs).objective or "")
    trials = {t.number: t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}
    again = reevals(study.user_attrs)
    own: dict[int, list[SeedValue]] = {}
    larger: dict[int, tuple[list[SeedValue], int] | None] = {}
    for number, seeds in sorted(confirmations(study.user_attrs).items()):
        trial = trials.get(number)
        done = [seeds[s] for s in sorted(seeds) if confirm_value(seeds[s], use_best) is not None]
        if trial is None or trial.value is None or not done:
            continue
        own[number] = [*own_values(trial, metric), *(v for r in done if (v := confirm_value(r, use_best)) is not None)]
        larger[number] = reevaluated_values(trial, again.get(number), done, study_seeds)
    counts = {found[1] for found in larger.values() if found is not None}
    if own and all(found is not None for found in larger.values()) and len(counts) == 1:
        return {n: found[0] for n, found in larger.items() if found is not None}, counts.pop()
    return own, None


def configuration_values(study: optuna.Study) -> dict[int, list[SeedValue]]:
    """{trial number: its values} for every COMPLETE trial with at least one confirm seed done (`_values`)."""
    return _values(study)[0]


def ranking_eval(study: optuna.Study) -> str:
    """Which eval the confirmed ranking's values are on, as a phrase for its lines."""
    examples = _values(study)[1]
    if examples is not None:
        return f"the re-evaluation's {examples} puzzles"
    return (
        "the trials' own eval (not every value was re-evaluated on one count)"
        if reevals(study.user_attrs)
        else ("the trials' own eval")
    )


def confirmed_ranking(study: optuna.Study) -> list[Confirmed]:
    """The confirmed configurations, best mean over seeds first; [] where the stage has not confirmed any."""
    if len(study.directions) != 1:
        return []
    stage = ConfirmStage.of(study.user_attrs.get(CONFIRM_STAGE_ATTR))
    own_at = stage.own_variance_at if stage else POOL_ALWAYS
    return rank(configuration_values(study), maximizing(study), own_at)


def trials_winner(study: optuna.Study) -> FrozenTrial | None:
    """The winner without confirmation: the re-evaluated one where there is one, else Optuna's best."""
    if len(study.directions) != 1:
        return None
    ranked = ranking(study)
    if ranked:
        return ranked[0].trial
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return study.best_trial if done else None


def failed_seeds(study: optuna.Study) -> list[ConfirmSeed]:
    """Confirm seeds whose job failed (the next run of the stage trains them again)."""
    records = confirmations(study.user_attrs)
    return [r for seeds in records.values() for r in seeds.values() if r.outcome != COMPLETE]


def confirmed_rows(study: optuna.Study) -> list[dict[str, Any]]:
    """The confirmed ranking as plain rows (sweeps.best's JSON, sweeps.status, the W&B summary): the mean, both
    standard errors and which the interval is, the seeds' values, and beside them the trial's own values."""
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    again = reevals(study.user_attrs)
    on = ranking_eval(study)
    rows = []
    for place, c in enumerate(confirmed_ranking(study), 1):
        trial = trials[c.trial]
        reeval = again.get(c.trial)
        rows.append(
            {
                "rank": place,
                "trial": c.trial,
                "mean": c.mean,
                "se": c.se,
                "se_kind": c.se_kind,
                "eval_se": c.eval_se,
                "seed_sd": c.seed_sd,
                "seed_sd_from": c.seed_sd_from,
                "n": c.n,
                "values": [v.value for v in c.values],
                "confirm_seeds": [v.seed for v in c.values if v.source == "confirm"],
                "reported": trial.value,
                "reeval": reeval.value if reeval is not None and reeval.failed is None else None,
                "on": on,  # which eval the values are on (ranking_eval)
            }
        )
    return rows


def confirmed_lines(study: optuna.Study) -> list[str]:
    """The confirmed ranking as text lines (sweeps.best, the driver's log); [] where nothing was confirmed."""
    ranked = confirmed_ranking(study)
    failed = [
        f"trial {r.trial} seed {r.seed} failed: {(r.error or 'no error recorded').splitlines()[0][:200]} "
        "(the same command trains it again)"
        for r in failed_seeds(study)
    ]
    if not ranked:
        return failed
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    again = reevals(study.user_attrs)
    metric = StudyAttrs.of(study.user_attrs).objective
    winner = trials[ranked[0].trial]
    shown = " ".join(to_overrides(params_to_values(winner.params)))
    lines = [f"confirmed winner: trial {winner.number} ({shown}), {metric} = {interval(ranked[0])} (mean over seeds)"]
    own = trials_winner(study)
    if own is not None and own.number != winner.number:
        lines.append(f"it differs from the trials' own winner, trial {own.number}")
    elif own is not None:
        lines.append("it is the trials' own winner")
    for place, c in enumerate(ranked, 1):
        trial = trials[c.trial]
        seeds = ", ".join(f"{v.value:.4f}" + (f" (seed {v.seed})" if v.seed is not None else "") for v in c.values)
        reported = f"{trial.value:.4f}" if trial.value is not None else "none"
        reeval = again.get(c.trial)
        beside = f", re-evaluated {reeval_interval(reeval)}" if reeval is not None and reeval.failed is None else ""
        lines.append(f"  {place}. trial {c.trial}: {interval(c)}; values {seeds}; reported {reported}{beside}")
    sd = ranked[0]
    on = ranking_eval(study)
    if sd.seed_sd is not None:
        lines.append(
            f"values on {on}; training-seed SD {sd.seed_sd:.4f} ({sd.seed_sd_from}), eval SE of the mean {sd.eval_se:.4f}"
        )
    else:
        lines.append(f"values on {on}; training-seed SD unknown (no configuration has two values): eval SE alone")
    tie = tie_line(ranked)
    if tie:
        lines.append(tie)
    return lines + failed
