"""A pruner that checks its own evidence: the configured Optuna pruner may stop a trial at a step only where the
study's own audit trials show that values at that step rank trials as their final objective does.

Why: early values can rank configurations backwards (deeper recursion starts slower and ends better:
docs/benchmarks.md, Pruning), and a pruner that compares them then removes the best configuration. Optuna's
pruners take the early ranking on trust; this one measures it.

The rule, per step ("rung") at which a trial reports:
- Audit trials (the first `audit_first` trials of the study, and every `audit_every`-th after them) are never
  pruned: their whole curves are the evidence. A retried trial keeps the status of the trial it retries.
- At a step, the rank agreement (Kendall's tau-b) between the audit trials' reported values there and their final
  objective values must be at least `min_agreement`, over at least `min_audit` completed audit trials; otherwise
  the rung is switched off and the wrapped pruner's verdict is ignored there.
- A step at which the audit trials all reported the same value (0.0 exact accuracy before any puzzle is solved)
  never prunes, whatever `min_agreement`: tau is undefined there, and a ranking of equal values is a coin flip.

The wrapped pruner is asked at every report (it keeps its own bookkeeping, e.g. the successive-halving rungs);
this pruner only vetoes its "prune". What was measured is stored on the study (storage.record.EvidenceRecord) when
it changes, and one line is logged for each rung switched on or off.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.pruners import BasePruner
from optuna.trial import FrozenTrial, TrialState
from scipy.stats import kendalltau

from contracts.pruning.near_best import cut_steps, near_best
from storage.heartbeat import chain_origin
from storage.record import EvidenceRecord, RungEvidence
from storage.study_record import StudyAttrs

log = logging.getLogger("sweeps.pruning")
CHECKS = ("agreement", "near_best")  # what backs a rung: the audits' rank agreement, or their near-best kept


class EvidencePruner(BasePruner):
    """Wraps an Optuna pruner; prunes only where `wrapped` says so and the study's audit trials back the rung."""

    def __init__(
        self,
        wrapped: BasePruner,
        audit_first: int = 4,
        audit_every: int = 0,
        min_audit: int = 4,
        min_agreement: float = 0.5,
        check: str = "agreement",
        eval_examples: int | None = None,
    ) -> None:
        if not isinstance(wrapped, BasePruner):
            raise TypeError(f"wrapped={wrapped!r}: expected an Optuna pruner (a `_target_: optuna.pruners.*` node)")
        if audit_first < 0 or audit_every < 0:
            raise ValueError(f"audit_first={audit_first}, audit_every={audit_every}: expected integers >= 0")
        if min_audit < 2:
            raise ValueError(f"min_audit={min_audit}: expected an integer >= 2 (a rank agreement needs two trials)")
        if not -1.0 <= min_agreement <= 1.0:
            raise ValueError(f"min_agreement={min_agreement}: expected a Kendall tau in [-1, 1]")
        if check not in CHECKS:
            raise ValueError(f"check={check!r}: expected one of {', '.join(CHECKS)}")
        if check == "near_best" and (eval_examples is None or eval_examples < 1):
            raise ValueError(
                f"check=near_best with eval_examples={eval_examples!r}: expected the eval's puzzle count (>= 1): "
                "the trials' train.eval_examples"
            )
        if audit_first < min_audit and audit_every == 0:
            raise ValueError(
                f"audit_first={audit_first} < min_audit={min_audit} with audit_every=0: no rung could ever prune"
            )
        self.wrapped = wrapped
        self.audit_first = audit_first
        self.audit_every = audit_every
        self.min_audit = min_audit
        self.min_agreement = min_agreement
        self.check = check
        self.eval_examples = eval_examples
        self._measured: tuple[tuple[object, ...], EvidenceRecord] | None = None  # by the study's finished trials

    def is_audit(self, trial: FrozenTrial) -> bool:
        """Whether a trial runs unpruned to its end (by the number of the first trial of its retry chain)."""
        number = chain_origin(trial)
        return number < self.audit_first or (
            self.audit_every > 0 and number >= self.audit_first and (number - self.audit_first) % self.audit_every == 0
        )

    def evidence(self, trials: Sequence[FrozenTrial], study: optuna.Study | None = None) -> EvidenceRecord:
        """Per step, what the audit trials show: their agreement between their value there and their final value
        (check=agreement), or the near-best audits the wrapped pruner would have cut there (check=near_best, which
        needs the study to ask the wrapped pruner in)."""
        audits = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None and self.is_audit(t)]
        if self.check == "near_best":
            if study is None:
                raise ValueError("check=near_best measures on the study: pass it")
            return self._near_best_evidence(study, trials, audits)
        finals = {t.number: float(t.values[0]) for t in audits}
        steps = sorted({step for t in audits for step in t.intermediate_values})
        rungs: dict[str, RungEvidence] = {}
        for step in steps:
            pairs = [(t.intermediate_values[step], finals[t.number]) for t in audits if step in t.intermediate_values]
            pairs = [(a, b) for a, b in pairs if math.isfinite(a) and math.isfinite(b)]
            tau = _kendall([a for a, _ in pairs], [b for _, b in pairs])
            on = len(pairs) >= self.min_audit and tau is not None and tau >= self.min_agreement
            rungs[str(step)] = {"tau": None if tau is None else round(tau, 4), "n": len(pairs), "on": on}
        return {
            "audit_trials": sorted(t.number for t in audits),
            "min_audit": self.min_audit,
            "min_agreement": self.min_agreement,
            "rungs": rungs,
        }

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        verdict = self.wrapped.prune(study, trial)  # asked every time: it keeps its own rung bookkeeping
        step = trial.last_step
        if step is None or self.is_audit(trial):
            return False
        trials = study.get_trials(deepcopy=False)
        finished = (id(study._storage), study._study_id) + tuple(
            (t.number, t.state.name) for t in trials if t.state.is_finished()
        )
        if self._measured is None or self._measured[0] != finished:  # measured again only when a trial finished
            self._measured = (finished, self.evidence(trials, study))
        record = self._measured[1]
        self._store(study, record)
        rung = record["rungs"].get(str(step))
        return bool(verdict) and rung is not None and rung["on"]

    def _near_best_evidence(
        self, study: optuna.Study, trials: Sequence[FrozenTrial], audits: Sequence[FrozenTrial]
    ) -> EvidenceRecord:
        """On at a step where >= min_audit audits reported and the wrapped pruner would have cut none of the audits
        within one eval standard error of their best (contracts/pruning/near_best.py)."""
        maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
        best = near_best(audits, maximize, int(self.eval_examples or 1))
        ordered = sorted(trials, key=lambda t: t.number)
        cuts = {t.number: cut_steps(study, self.wrapped, ordered, t) for t in best}
        steps = sorted({step for t in audits for step in t.intermediate_values})
        rungs: dict[str, RungEvidence] = {}
        for step in steps:
            n = sum(step in t.intermediate_values for t in audits)
            cut = sorted(number for number, at in cuts.items() if step in at)
            rungs[str(step)] = {"tau": None, "n": n, "on": n >= self.min_audit and not cut, "near_best_cut": cut}
        return {
            "audit_trials": sorted(t.number for t in audits),
            "min_audit": self.min_audit,
            "min_agreement": self.min_agreement,
            "check": "near_best",
            "near_best": sorted(t.number for t in best),
            "rungs": rungs,
        }

    def _store(self, study: optuna.Study, record: EvidenceRecord) -> None:
        """Write the record when it changed (a new audit trial completed), logging each rung switched on or off."""
        stored = StudyAttrs.of(study.user_attrs).pruner_evidence
        if stored == record:
            return
        before: dict[str, Any] = dict(stored.get("rungs", {})) if isinstance(stored, dict) else {}
        for step, rung in record["rungs"].items():
            if rung["on"] != (before.get(step) or {}).get("on", False):
                log.info(
                    "pruning at step %s switched %s: Kendall tau %s over %d audit trials (needs >= %g over >= %d)",
                    step, "on" if rung["on"] else "off", rung["tau"], rung["n"], self.min_agreement, self.min_audit,
                )  # fmt: skip
        StudyAttrs(pruner_evidence=record).store(study.set_user_attr)


def _kendall(x: list[float], y: list[float]) -> float | None:
    """Kendall's tau-b; None where it is undefined (fewer than two trials, or all values equal on one side)."""
    if len(x) < 2 or len(set(x)) < 2 or len(set(y)) < 2:
        return None
    tau = float(kendalltau(x, y).statistic)
    return tau if math.isfinite(tau) else None
