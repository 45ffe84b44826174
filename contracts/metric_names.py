"""The names of the training metrics, without torch: the sweep driver validates study settings against them.

Names follow the TRM reference; the trainer logs each as `train/<name>` and `eval/<name>`."""

from __future__ import annotations

# Order of the metric sums in the vector `trm.losses.act_loss` returns.
METRIC_KEYS = (
    "count",  # halted examples with a label (the divisor of the rates; logged as HALTED_EXAMPLES)
    "accuracy",  # fraction of answer cells correct
    "exact_accuracy",  # whole puzzle correct
    "blank_accuracy",  # fraction of the blank cells correct (the cells that need solving)
    "q_halt_accuracy",  # Q-halt sign agrees with "whole puzzle correct"
    "steps",  # supervision steps used
    "examples",  # all (real) examples in the batch: the divisor of the train losses
    "lm_loss",
    "q_halt_loss",
)
# Which way is better, for the metrics a pruner may be given (it compares them in the study's direction).
MAXIMIZED = ("accuracy", "exact_accuracy", "blank_accuracy", "q_halt_accuracy")
MINIMIZED = ("lm_loss", "q_halt_loss")
# The number of halted examples is logged under this name, not as `count`: the reference logs `train/count` as
# count / count (always 1) and no eval count, so the same name would show another quantity (docs/fidelity.md).
HALTED_EXAMPLES = "halted_examples"
# The names trm.losses.normalize_metrics logs, each as `train/<name>` and `eval/<name>` (docs/fidelity.md, Metrics).
LOGGED_METRICS = tuple(HALTED_EXAMPLES if key == "count" else key for key in METRIC_KEYS if key != "examples")
# What the trainer logs at each eval: a study's objective is read from these, at the best or the last eval.
EVAL_METRICS = tuple(f"eval/{key}" for key in LOGGED_METRICS)
# Numbers a trial's job stores on the trial besides its metrics (trm/links/trial.py, `finish`): the extra
# objectives of a multi-objective study may name them (model_scaling_pareto minimizes compute_flops).
TRIAL_NUMBERS = (
    "best_value",
    "best_step",
    "steps",
    "params_count",
    "flops_per_sample_step",
    "compute_flops",
    "train_seconds",
)
