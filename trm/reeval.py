"""Evaluate a trained checkpoint again on a larger eval: `python -m trm.train <the run's overrides> reeval.run=true
[reeval.examples=N] [reeval.checkpoint=best.pt]` (conf/train.yaml, `reeval`).

Why: a study's trials are ranked by an eval of a few hundred puzzles, whose binomial noise is as large as the gaps
between its best trials. This job is a real one, started by the sweep's launcher like a trial (sweeps/trials/reeval.py):
the trainer's data, model and `trm.step.evaluate` on the trial's runtime, run on the checkpoint the trial wrote.
A checkpoint whose identity is not this config's is refused (trm.checkpoints.checkpoint.check_identity), so the value
always belongs to the trial's training. Rank 0 prints the result and, for a sweep trial, stores it on the study
(storage.record.Reeval): only a finished evaluation is stored, so a killed job leaves nothing half-written.
"""

from __future__ import annotations

import json
from typing import cast

from contracts.eval_noise import binomial_stderr
from contracts.hydra_app import TrainJob
from contracts.metric_names import HALTED_EXAMPLES, MAXIMIZED
from contracts.train_config import SweepLink
from storage.record import Reeval, reeval_attr
from trm.checkpoints import checkpoint
from trm.data.loader import eval_batches
from trm.fingerprint import training_identity
from trm.job_inputs import check_batch, load_data, out_dir
from trm.links.confirm import store_reeval
from trm.links.trial import open_linked_study, retry
from trm.model import ACTModel, TRMConfig
from trm.optim import build_ema
from trm.precision import device_facts, resolve_precision
from trm.runtime import init_runtime
from trm.runtime.base import Runtime
from trm.schedules import recursion_at
from trm.step import evaluate

SHARES = tuple(f"eval/{name}" for name in MAXIMIZED)  # metrics that are a share of puzzles (or cells) right


def run(job: TrainJob) -> Reeval:
    """Evaluate `checkpoint.url`/`reeval.checkpoint` on `reeval.examples` test puzzles (every rank takes part)."""
    cfg = job.app
    runtime = init_runtime(cfg.runtime)
    clean = False
    try:
        record = _evaluate(job, runtime)
        if runtime.is_main:
            print(json.dumps({"event": "reeval", **record.as_dict()}), flush=True)
            out_dir(cfg).mkdir(parents=True, exist_ok=True)
            (out_dir(cfg) / "reeval.json").write_text(json.dumps(record.as_dict()))
            if cfg.sweep.study is not None and cfg.sweep.confirm:  # a confirm seed's checkpoint (trm/links/confirm.py)
                store_reeval(cfg.sweep, cfg.seed, record)
            elif cfg.sweep.study is not None:
                store(cfg.sweep, record)
        clean = True
        return record
    finally:
        runtime.close(clean)


def _evaluate(job: TrainJob, runtime: Runtime) -> Reeval:
    """The checkpoint's eval on this rank's share: the model, data and recursion its training used."""
    cfg = job.app
    train = cfg.train
    check_batch(train, runtime)
    chosen = resolve_precision(train.precision, device_facts(runtime.device), train.bf16_mode)
    _, test_arrays, train_meta, _ = load_data(cfg.data)
    arch = TRMConfig.from_dict(cfg.arch, **train_meta.arch_fields())
    model = ACTModel(arch).to(runtime.device)
    ema = build_ema(model, cfg.optim.ema_decay) if train.ema else None
    url, name = cfg.checkpoint.url, cfg.reeval.checkpoint
    where = f"{url.rstrip('/')}/{name}"
    saved, failure = None, None
    if runtime.is_main:  # rank 0 alone may see the path: it reads and hands the checkpoint to every rank
        try:
            saved = checkpoint.load(url, name)
            if saved is None:
                failure = checkpoint.CheckpointError(f"no checkpoint at {where}: nothing to evaluate again")
        except checkpoint.CheckpointError as err:
            failure = err
    saved, failure = runtime.broadcast_object((saved, failure))
    if failure is not None:
        raise failure
    identity = {"config": training_identity(job.written, chosen.mode), "data": train_meta.fingerprint}
    checkpoint.check_identity(saved, identity, where)
    model.load_state_dict(saved["model"])
    if ema is not None and saved.get("ema") is not None:
        ema.load_state_dict(saved["ema"])
    eval_model = cast(ACTModel, ema.module) if (ema is not None and train.eval_with_ema) else model
    step = int(saved["step"])
    # The recursion the trial's eval at this step used: the loop's progress before its last step.
    cycles = recursion_at((step - 1) / train.steps, cfg.curriculum, arch.H_cycles, arch.L_cycles)
    share = train.eval_batch_size // runtime.world_size
    batches = eval_batches(test_arrays, share, runtime.rank, runtime.world_size, cfg.reeval.examples)
    metrics = evaluate(eval_model, batches, runtime, cycles, precision=chosen.mode, loss=train.loss)
    objective = train.objective
    counted = int(metrics[f"eval/{HALTED_EXAMPLES}"])
    value = float(metrics[objective])
    return Reeval(
        trial=cfg.sweep.trial_number if cfg.sweep.trial_number is not None else -1,
        metric=objective,
        value=value,
        stderr=binomial_stderr(value, counted) if objective in SHARES else None,
        examples=counted,
        step=step,
        checkpoint=where,
    )


def store(sweep: SweepLink, record: Reeval) -> None:
    """Store `record` on the sweep's study (retried through a database outage), refusing a study of the same name
    that is not the one whose trial trained the checkpoint (another uid)."""
    storage, study_id, _ = open_linked_study(sweep, "the re-evaluation is not stored")
    policy = sweep.report_retry
    retry(
        lambda: storage.set_study_user_attr(study_id, reeval_attr(record.trial), record.as_dict()),
        f"storing the re-evaluation of trial {record.trial}",
        policy,
    )
