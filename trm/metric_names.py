"""The names of the training metrics, without torch: the sweep driver validates study settings against them.

Names follow the TRM reference; the trainer logs each as `train/<name>` and `eval/<name>`."""
from __future__ import annotations

# Order of the metric sums in the vector `trm.losses.act_loss` returns.
METRIC_KEYS = (
    "count",  # halted examples (metrics are over finished puzzles)
    "accuracy",  # fraction of answer cells correct
    "exact_accuracy",  # whole puzzle correct
    "blank_accuracy",  # fraction of the blank cells correct (the cells that need solving)
    "q_halt_accuracy",  # Q-halt sign agrees with "whole puzzle correct"
    "steps",  # supervision steps used
    "examples",  # all examples in the batch (divisor of the losses)
    "lm_loss",
    "q_halt_loss",
)
# Which way is better, for the metrics a pruner may be given (it compares them in the study's direction).
MAXIMIZED = ("accuracy", "exact_accuracy", "blank_accuracy", "q_halt_accuracy")
MINIMIZED = ("lm_loss", "q_halt_loss")
