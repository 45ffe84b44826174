"""The near-best check of the evidence-checking pruner (contracts/pruning/evidence.py, `check: near_best`): at each
step, would the wrapped pruner have stopped one of the study's own best audit trials there?

Why: a rank agreement over the audit trials (the `agreement` check) cannot be measured when the audits are
near-equal (four MLP-t trials within the eval's noise of each other agree on nothing), so it kept pruning off
while trials that could never win trained on. The question that matters is narrower: pruning at a step is safe
when the rule would have kept every audit trial that ended within one eval standard error of the audits' best.

How: a scratch copy of the study on an in-memory storage (same name and trial numbers, so Hyperband puts each
trial in the same bracket), in which the audit trial under test is running again and reports its recorded values
step by step, asking the wrapped pruner after each. The wrapped pruner is the study's own instance: Optuna's
pruners keep no per-study state beyond what they write to the trial being judged (the successive-halving rungs),
and that trial is the scratch copy. Optuna has no "what would you have said" call, hence this replay.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import optuna
from optuna.pruners import BasePruner
from optuna.trial import FrozenTrial, TrialState

from contracts.eval_noise import binomial_stderr


def near_best(audits: Sequence[FrozenTrial], maximize: bool, eval_examples: int) -> list[FrozenTrial]:
    """The completed audit trials whose final value is within one eval standard error of the audits' best."""
    if not audits:
        return []
    values = [float(t.values[0]) for t in audits]
    best = max(values) if maximize else min(values)
    margin = binomial_stderr(best, eval_examples)
    return [t for t, v in zip(audits, values) if (v >= best - margin if maximize else v <= best + margin)]


def cut_steps(study: optuna.Study, wrapped: BasePruner, trials: Sequence[FrozenTrial], audit: FrozenTrial) -> set[int]:
    """The steps at which `wrapped` would have pruned `audit`, had it been running among the study's other
    finished trials (`trials`: the study's, in number order)."""
    quiet = logging.getLogger("optuna.storages._in_memory")  # "A new study created in memory": per measurement
    level, quiet.level = quiet.level, logging.WARNING
    try:
        scratch = optuna.create_study(
            storage=optuna.storages.InMemoryStorage(), study_name=study.study_name, direction=study.direction
        )
    finally:
        quiet.setLevel(level)
    trial_id = None
    for t in trials:
        if t.number == audit.number:
            trial_id = scratch._storage.create_new_trial(scratch._study_id)  # RUNNING, with the audit's number
        elif t.state.is_finished():
            scratch.add_trial(t)
        else:  # a running or waiting trial: it holds its number, but no pruner compares against it
            scratch.add_trial(optuna.trial.create_trial(state=TrialState.FAIL))
    if trial_id is None:
        raise ValueError(f"trial {audit.number} is not among the study's trials")
    cut: set[int] = set()
    for step, value in sorted(audit.intermediate_values.items()):
        scratch._storage.set_trial_intermediate_value(trial_id, step, value)
        if wrapped.prune(scratch, scratch._storage.get_trial(trial_id)):
            cut.add(step)
    return cut
