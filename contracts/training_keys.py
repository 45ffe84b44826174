"""The training config's keys sorted by what they mean for a run: those its workers, or its resumption, may set
differently, and those that do not change what it trains."""

from __future__ import annotations

# Keys that legitimately differ between workers (each VM has its own output directory) or between a run
# and its resumption.
WORKER_LOCAL_KEYS = ("out_dir", "checkpoint", "runtime", "hydra")
# Keys that do not change what a run trains: where it writes, how it is watched, when it pauses, which
# attempt of a sweep trial it is (a retry resumes its first attempt's checkpoint), and where the data lies
# on this disk (its content is identified by the dataset fingerprint instead). What a checkpoint must match
# (trm/fingerprint.py) and what defines a study (sweeps/search/definition.py) leave them out.
NOT_TRAINING_KEYS = (
    *WORKER_LOCAL_KEYS,
    "wandb",
    "data.root",
    "data.path",
    "train.progress",
    "train.stop_after",
    "train.preemption_check_interval",
    "train.profile_steps",
    "sweep.trial_number",
    "sweep.job",
    "sweep.sampled",  # names the keys whose values are in the config already
    "sweep.confirm",  # where a confirm job stores its end; what it trains again differs by `seed`
    "sweep.password_env",
    "sweep.report_retry",  # how the job talks to the study storage, not what it trains
    "sweep.memory_sample_s",  # how often it samples its memory onto the trial
    "sweep.storage_engine",
    "reeval",  # evaluating a trained checkpoint again reads it, never trains it (trm/reeval.py)
)


def under(key: str, keys: tuple[str, ...]) -> bool:
    """Whether the dotted `key` is one of `keys` or below one of them (`runtime.port` is under `runtime`)."""
    return any(key == k or key.startswith(f"{k}.") for k in keys)
