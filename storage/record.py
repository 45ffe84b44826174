"""The study record's names: what the sweep driver writes on a study and the training job reads.

The record is the contract between the driver and the job (docs/architecture in DESIGN: "the study record is
the channel back"); its names live here, in `storage`, which both sides may import.
"""
from __future__ import annotations

# Study attributes the driver writes and the job reads.
PRUNER_ATTR = "pruner"  # the pruner as a `_target_` dict: every job asks the pruner the driver configured
OBJECTIVE_ATTR = "objective"
PRUNE_METRIC_ATTR = "prune_metric"  # what the job reports at each eval (absent: the objective)
# A random id the study gets when first opened. Trial directories and checkpoints carry it, so a new study
# under an old name (a new storage, a deleted study) never resumes the old study's checkpoints.
STUDY_UID_ATTR = "uid"
