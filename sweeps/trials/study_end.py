"""What runs once the driver's loop has ended: the top trials re-evaluated, the top configurations confirmed, the
W&B study summary; each stage where the sweep config switches it on (reeval.at_end, confirm.at_end).

The stages read the study's records through the TrialRunner of the open study and start their own jobs on its
launcher; the driver's loop has no trial running by then.
"""

from __future__ import annotations

from sweeps.trials.confirm import ConfirmStageRun, confirm_at_end
from sweeps.trials.reeval import reevaluate_at_end
from sweeps.trials.trial_runner import TrialRunner
from sweeps.trials.wandb_summary import log_study_summary


def run_end_stages(trials: TrialRunner, storage_url: str, deadline: float | None) -> None:
    """Re-evaluation, confirm stage (within `deadline`, epoch seconds: the study's timeout), then the W&B summary."""
    study, sweep = trials.study, trials.sweep
    if sweep.reeval.at_end:  # the top trials' checkpoints on a larger eval (sweeps/trials/reeval.py)
        reevaluate_at_end(study, trials.storage, sweep, trials.launcher, trials.roots, trials.study_uid, storage_url)
    if sweep.confirm.at_end:  # the top configurations on fresh seeds (sweeps/trials/confirm.py)
        stage = ConfirmStageRun(study, sweep, trials.launcher, trials.roots, trials.study_uid, storage_url)
        confirm_at_end(study, trials.storage, stage, deadline=deadline)
    log_study_summary(study, sweep)
