"""Train a Tiny Recursive Model: `python -m trm.train [arch=...] [optim=...] [key=value ...]`.

Read top to bottom: start the runtime, set up (trm/train_setup.py: the data, the model and optimizers, the
resume if a checkpoint exists), then loop. Each step is one supervision step of deep supervision on a batch of
carries; metrics stay on the device and are read only at log/eval points (no host sync inside the step). Rank 0
alone logs, evaluates the objective against the best so far, writes checkpoints and talks to the sweep.

Beside it: trm/step.py (the step, the eval, their precision), trm/train_state.py (what a checkpoint holds,
the best so far), trm/checkpointer.py (the collective save and resume), trm/preemption.py (SIGTERM),
trm/measures/clock.py (the phase stamps of the summary's `timing`), trm/run_end.py (how the run ends and who is told).
"""

from __future__ import annotations

import logging
import math
import os
import sys
from dataclasses import replace
from typing import Any, cast

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from tqdm import tqdm

from contracts import train_config
from contracts.hydra_app import CONFIG_PATH, HYDRA_CALLBACKS, TrainJob, run_app
from contracts.metrics_log import open_metrics
from contracts.run_summary import RunSummary
from contracts.train_config import TrainApp
from trm.checkpoints import writer_lock
from trm.checkpoints.checkpoint import check_url
from trm.job_inputs import out_dir as job_out_dir
from trm.links.confirm import ConfirmLink
from trm.links.trial import link_from_config
from trm.losses import normalize_metrics
from trm.measures.clock import PhaseClock
from trm.measures.memory import peak_memory_mb
from trm.measures.profiling import StepProfiler, profile_window
from trm.measures.throughput import StepTimer
from trm.model import ACTModel
from trm.optim import lr_multiplier, set_lr, update_ema
from trm.precision import Precision
from trm.preemption import PreemptionFlag
from trm.run_end import ABANDONED, COMPLETE, FAIL, PREEMPTED, PRUNED, NonFiniteLossError, Outcome, Reporter, RunLog
from trm.runtime import init_runtime
from trm.runtime.base import Runtime
from trm.schedules import exploration_at, recursion_at
from trm.step import carry_dtype, evaluate, train_step
from trm.tracking.tracker import make_tracker
from trm.train_setup import Trainer, setup
from trm.train_state import TrainState

train_config.register()  # conf/train.yaml's schema (contracts/train_config.py), before hydra.main composes it


def run(job: TrainJob, reporter: Reporter | None = None) -> RunSummary:
    """Train to the end, to a pruning verdict, or to an error; return the summary (rank 0's is complete)."""
    cfg = job.app
    check_url(cfg.checkpoint.url)  # a gs:// without gcsfs: refused before the runtime starts, not at the first save
    runtime = init_runtime(cfg.runtime)
    clean = False
    try:
        if reporter is None and runtime.is_main:  # a confirm job stores on the study, a trial's job on its trial
            confirming = cfg.sweep.confirm and cfg.sweep.study is not None
            reporter = (
                ConfirmLink(cfg.sweep, cfg.seed, cfg.checkpoint.url) if confirming else link_from_config(cfg.sweep)
            )
        with writer_lock.held(cfg.checkpoint.url, cfg.checkpoint.lock_wait_s, runtime.is_main):  # one writer
            summary = train_loop(setup(job, runtime), reporter)
        clean = True
        return summary
    except BaseException as err:
        # Failures before the loop (bad data, workers that disagree) reach the trial too.
        if reporter is not None:
            (failed := Outcome()).failed(err)  # retryable and run_again as for a failure in the loop
            # The peak too: a model too large for the machine fails in its set-up, and its peak says how far it got.
            peak = peak_memory_mb(runtime.device)
            reporter.record_outcome(
                RunSummary(
                    outcome=FAIL,
                    error=failed.error,
                    retryable=failed.retryable,
                    run_again=failed.run_again,
                    peak_memory_mb=peak,
                )
            )
        raise
    finally:
        runtime.close(clean)  # no barrier after a failure: a dead peer would make it wait for the timeout


def train_loop(t: Trainer, reporter: Reporter | None) -> RunSummary:
    """Train from `t.state.step` to the end, to a stop or to an error; the run's summary, recorded (metrics.jsonl,
    summary.json, the tracker, rank 0's reporter) however it ended. `run` records a failure raised here."""
    cfg, runtime, state, train = t.cfg, t.runtime, t.state, t.cfg.train
    is_main, out_dir, total = runtime.is_main, job_out_dir(cfg), train.steps
    metrics_file = open_metrics(out_dir) if is_main else None
    bar = tqdm(
        total=total, initial=state.step, disable=not (is_main and train.progress), desc="train", dynamic_ncols=True
    )
    log = RunLog(out_dir, metrics_file, make_tracker(t.job, is_main, t.params, t.chosen))
    outcome = Outcome()
    timer = StepTimer()  # steady-state step time, for the trial's `throughput` (trm/measures/throughput.py)
    preemption = PreemptionFlag()
    profiler = StepProfiler(
        profile_window(train.profile_steps) if is_main else None, out_dir, runtime.backend, runtime.device
    )
    if is_main and reporter is not None:
        reporter.progress(state.step)  # set up (data, model, resume): the first steps may compile for a while
    try:
        for step in range(state.step, total):
            profiler.before_step(step)
            cycles = train_one(t, step)
            done = state.step
            profiler.after_step(done)
            t.clock.stamp_once("first_step_end")
            t.clock.stamp("last_step_end")
            bar.update(1)
            if done % train.log_interval == 0 or done == total:
                log_point(t, log, timer, bar, reporter, cycles)
            if done % train.eval_interval == 0 or done == total:
                with timer.excluded():  # evals and checkpoints are not step time
                    verdict, to_best = eval_point(t, log, reporter, cycles)
                    status = stop_status(t, verdict, to_best, preemption)
            else:
                status = stop_status(t, None, False, preemption)  # no eval at this step
            if status is not None:
                outcome.status = status
                break
        t.clock.stamp("train_end")  # after the last step's eval and checkpoint: training work ends here
        outcome.rank_steps = t.checkpointer.finish()  # the last upload landed; every rank's step
    except Exception as err:  # record why (once an upload in flight landed, within its grace), then let it propagate
        t.checkpointer.failed(outcome, err)
        raise
    finally:
        preemption.restore()
        bar.close()
        throughput = timer.summary(t.params.get("flops_per_sample_step", 0), train.global_batch_size, runtime.devices)
        summary = summarize(cfg, state, outcome, t.clock, t.params, t.chosen, str(runtime.device), throughput)
        summary = replace(summary, profile=profiler.close(), peak_memory_mb=peak_memory_mb(runtime.device))  # written
        log.close(summary)
        t.clock.stamp("end")  # after the W&B run is closed: what is left is the outcome write and exit
        if is_main and reporter is not None:
            reporter.record_outcome(summary)
    return summary


def train_one(t: Trainer, step: int) -> tuple[int, int]:
    """Step `step` (from 0): one supervision step on a batch of carries; the metrics stay on the device (no host
    sync). Returns the recursion cycles (H, L) it ran."""
    cfg, runtime, state = t.cfg, t.runtime, t.state
    total = cfg.train.steps
    progress = step / total
    cycles = recursion_at(progress, cfg.curriculum, t.arch.H_cycles, t.arch.L_cycles)
    exploration = torch.tensor(exploration_at(progress, cfg.halting), device=runtime.device)
    set_lr(state.optimizers, lr_multiplier(step, cfg.optim.warmup_steps, total, cfg.optim.lr_min_ratio))
    batch = runtime.to_device(next(state.loader))
    t.clock.stamp_once("first_step_start")
    if state.carry is None:
        state.carry = state.model.initial_carry(batch, carry_dtype(t.chosen.mode))
    state.carry, metrics = train_step(
        t.step_model,
        state.carry,
        batch,
        exploration,
        cycles,
        state.optimizers,
        precision=t.chosen.mode,
        loss=t.loss,
        grad_clip=t.grad_clip,
        loss_divisor=t.loss_divisor,
    )
    if state.ema is not None:
        update_ema(state.ema, state.model)
    runtime.step_boundary()
    state.train_sums += metrics  # stays on the device: read only at log points
    state.step = step + 1
    return cycles


def log_point(
    t: Trainer, log: RunLog, timer: StepTimer, bar: tqdm[Any], reporter: Reporter | None, cycles: tuple[int, int]
) -> None:
    """The train metrics since the last log point, logged (this waits for the device); rank 0 reports progress."""
    is_main, done = t.runtime.is_main, t.state.step
    record = train_record(t.runtime, t.state, t.state.optimizers, cycles)  # waits for the device
    compile_warning = timer.mark(done)
    if compile_warning and is_main:
        print(compile_warning, file=sys.stderr, flush=True)
    with timer.excluded():  # logging and the progress write to the study are not step time
        log.log({"step": done, **record})
        if is_main and reporter is not None:
            reporter.progress(done)
        bar.set_postfix(loss=f"{record['train/lm_loss']:.3f}", acc=f"{record['train/accuracy']:.3f}")


def eval_point(t: Trainer, log: RunLog, reporter: Reporter | None, cycles: tuple[int, int]) -> tuple[str, bool]:
    """Evaluate, keep the best and ask the reporter for its verdict (the same on every rank); the verdict and
    whether this step's save writes best.pt too. The save itself is `stop_status`'s: one save per step."""
    train, state, done = t.cfg.train, t.state, t.state.step
    ema = state.ema
    eval_model = cast(ACTModel, ema.module) if (ema is not None and train.eval_with_ema) else state.model
    state.last_eval = evaluate(
        eval_model, t.eval_set(train.eval_examples), t.runtime, cycles, precision=t.chosen.mode, loss=t.loss
    )
    log.log({"step": done, **state.last_eval})
    value = state.last_eval[train.objective]
    improved = state.best.update(value, done, state.last_eval)
    to_best = t.checkpointer.takes_best(value, done, improved)
    verdict = reporter.report(done, state.last_eval) if (t.runtime.is_main and reporter is not None) else "continue"
    verdict = t.runtime.broadcast_object(verdict)  # every rank stops at the same step
    return verdict, to_best


def stop_status(t: Trainer, verdict: str | None, to_best: bool, preemption: PreemptionFlag) -> str | None:
    """Whether the run stops after the step just done, given its eval's `verdict` (None: no eval at this step) and
    whether that eval takes best.pt (`to_best`): the outcome to stop with, or None to go on. The one place a run
    decides to stop (an error stops it by raising) and the one save of a step: an eval, a preemption notice and a
    `stop_after` that meet at one step share it. Every rank calls it after every step: the preemption check and the
    save are collective.

    "abandon" (the trial was given to someone else) saves nothing, unless a preemption notice came too: the driver
    sets a preempted slice's trials aside, and the trial, queued again, resumes from this save."""
    train, done = t.cfg.train, t.state.step
    notices = []  # when each rank's SIGTERM came, if one did
    if done % train.preemption_check_interval == 0:
        notices = [at for at in t.runtime.all_gather_object(preemption.raised_at) if at is not None]
    preempted = bool(notices)
    if preempted:
        t.checkpointer.stop_from(min(notices))  # the save below ends within the kill grace, or is cut
    evaluated = verdict is not None and verdict != "abandon"
    if preempted or evaluated or (done == train.stop_after and verdict != "abandon"):
        t.checkpointer.save(best=to_best)
    if verdict == "abandon":
        return ABANDONED
    if verdict == "prune":
        return PRUNED
    if done == train.stop_after:
        return COMPLETE
    if preempted:  # a VM got SIGTERM (a preemption notice): saved above while we still can
        return PREEMPTED
    return COMPLETE if done == train.steps else None


def train_record(
    runtime: Runtime, state: TrainState, optimizers: list[torch.optim.Optimizer], cycles: tuple[int, int]
) -> dict[str, float]:
    """The train metrics since the last log point, reduced over the ranks (the sums start again); a non-finite
    loss stops the run."""
    reduced = normalize_metrics(runtime.all_reduce_sum(state.train_sums).tolist(), "train")
    state.train_sums.zero_()
    if not all(math.isfinite(reduced[f"train/{k}"]) for k in ("lm_loss", "q_halt_loss")):
        raise NonFiniteLossError(
            f"non-finite loss at step {state.step}: lm_loss={reduced['train/lm_loss']}, q_halt_loss={reduced['train/q_halt_loss']}"
        )
    reduced.update(
        {"train/lr": optimizers[0].param_groups[0]["lr"], "train/H_cycles": cycles[0], "train/L_cycles": cycles[1]}
    )
    return reduced


def summarize(
    cfg: TrainApp,
    state: TrainState,
    outcome: Outcome,
    clock: PhaseClock,
    params: dict[str, int],
    precision: Precision,
    device: str,
    throughput: dict[str, Any] | None,
) -> RunSummary:
    """The run's summary (contracts/run_summary.py): summary.json, the `end` line, the tracker's summary and what the
    trial stores."""
    flops = params.get("flops_per_sample_step")  # rank 0's count only
    return RunSummary(
        outcome=outcome.status,
        error=outcome.error,
        steps=state.step,
        rank_steps=outcome.rank_steps,
        retryable=outcome.retryable,
        run_again=outcome.run_again,
        objective=cfg.train.objective,
        precision=precision.mode,
        precision_reason=precision.reason,
        device=device,
        best_value=state.best.found_value,
        best_step=state.best.step,
        best_checkpoint=state.best_file.to_dict() | {"note": state.best_file.note},
        final=state.last_eval,
        seconds=clock.seconds(),
        timing=clock.stamps,  # the live dict: `end` is stamped after the files are written
        compute_flops=(flops or 0) * cfg.train.global_batch_size * state.step,
        throughput=throughput,
        params=params["params"],
        puzzle_emb_params=params["puzzle_emb_params"],
        flops_per_sample_step=flops,
    )


@hydra.main(config_path=CONFIG_PATH, config_name="train", execution_whitelist=HYDRA_CALLBACKS)
def main(cfg: DictConfig) -> float | None:
    """Train; return the run's objective (`train.objective`, best over its evals) and nothing else, so that Hydra's
    own sweepers (hydra-optuna-sweeper: `python -m trm.train -m hydra/sweeper=optuna ...`) can optimize it.
    With reeval.run=true: evaluate the run's checkpoint again instead (trm/reeval.py, which imports this module)."""
    # Typed once (the ranges too: Hydra checked keys, types and choices as it composed), with its command line.
    job = TrainJob.of(cfg, tuple(HydraConfig.get().overrides.task))
    if job.app.reeval.run:
        from trm import reeval

        return reeval.run(job).value
    value = run(job).best_value
    return None if value is None else float(value)


def cli() -> None:
    """The `trm-train` console script."""
    run_app(main)


if __name__ == "__main__":
    run_app(main)  # a failure exits inside (Hydra prints it and exits 1): past this line the run finished cleanly
    # Leave without the interpreter's teardown: everything is written and closed, and (1) torch's gloo threads
    # can abort a finished rank of a multi-process job at exit (SIGABRT in C++ static destructors), (2) torch's
    # and W&B's teardown would delay the driver seeing a job whose outcome is already stored.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
