"""Rank 0's links to the study: a sweep trial's (trial: reports, pruner verdicts, the outcome) and a job outside a
trial's (confirm: a confirm seed's progress and end, a re-evaluation's result).

Above the model: only the job's entry modules (trm/train.py, trm/reeval.py) import this room; the model, its step,
optimizers, data and training state never do (an import contract in pyproject.toml).
"""
