"""Train a Tiny Recursive Model: `python -m trm.train [arch=...] [optim=...] [key=value ...]`.

Read top to bottom: set up the runtime and data, build the model and optimizers, resume if a checkpoint
exists, then loop. Each step is one supervision step of deep supervision on a batch of carries; metrics
stay on the device and are read only at log/eval points (no host sync inside the step). Rank 0 alone
logs, evaluates the objective against the best so far, writes checkpoints and talks to the sweep.

Beside it: trm/step.py (the step, the eval, their precision), trm/train_state.py (what a checkpoint holds,
the best so far, the collective save and resume), trm/preemption.py (SIGTERM), trm/clock.py (the phase
stamps of the summary's `timing`), trm/run_end.py (how the run ends and who is told).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any, cast

import hydra
import torch
from omegaconf import DictConfig
from tqdm import tqdm

from contracts import train_config
from contracts.choices import compile_mode
from contracts.hydra_app import CONFIG_PATH, HYDRA_CALLBACKS, run_app, to_dict
from contracts.metrics_log import open_metrics
from trm import train_state, writer_lock
from trm.checkpoint import check_url
from trm.clock import PhaseClock
from trm.compiling import apply_compile
from trm.data.loader import TrainLoader, eval_batches
from trm.fingerprint import code_fingerprint, config_fingerprint, training_identity
from trm.flops import flops_per_sample_step
from trm.job_inputs import check_batch, load_data
from trm.kernels import apply_kernels, resolve_kernels
from trm.losses import METRIC_KEYS, normalize_metrics
from trm.memory import peak_memory_mb
from trm.model import ACTModel, TRMConfig, count_params
from trm.optim import build_ema, build_optimizers, lr_multiplier, set_lr, update_ema
from trm.precision import Precision, device_facts, resolve_precision
from trm.preemption import PreemptionFlag
from trm.profiling import StepProfiler, profile_window
from trm.run_end import ABANDONED, FAIL, PREEMPTED, PRUNED, NonFiniteLossError, Outcome, Reporter, RunLog
from trm.runtime import init_runtime
from trm.runtime.base import Runtime, check_agreement
from trm.schedules import exploration_at, recursion_at, validate_curriculum
from trm.step import carry_dtype, evaluate, train_step
from trm.throughput import StepTimer
from trm.tracking import make_tracker
from trm.train_state import Best, TrainState
from trm.trial_link import link_from_config

train_config.register()  # conf/train.yaml's schema (contracts/train_config.py), before hydra.main composes it


def run(cfg: DictConfig, reporter: Reporter | None = None) -> dict[str, Any]:
    """Train to the end, to a pruning verdict, or to an error; return the summary (rank 0's is complete)."""
    check_url(cfg.checkpoint.url)  # a gs:// without gcsfs: refused before the runtime starts, not at the first save
    runtime = init_runtime(cfg.runtime)
    clean = False
    try:
        if reporter is None and runtime.is_main:
            reporter = link_from_config(cfg)
        with writer_lock.held(cfg.checkpoint.url, cfg.checkpoint.lock_wait_s, runtime.is_main):  # one writer
            summary = train_in_runtime(cfg, runtime, reporter)
        clean = True
        return summary
    except BaseException as err:
        # Failures before the loop (bad data, workers that disagree) reach the trial too.
        if reporter is not None:
            (failed := Outcome()).failed(err)  # retryable and run_again as for a failure in the loop
            reporter.record_outcome(
                FAIL, {"error": failed.error, "retryable": failed.retryable, "run_again": failed.run_again}
            )
        raise
    finally:
        runtime.close(clean)  # no barrier after a failure: a dead peer would make it wait for the timeout


def train_in_runtime(cfg: DictConfig, runtime: Runtime, reporter: Reporter | None) -> dict[str, Any]:  # noqa: C901, PLR0915 (split into setup, loop and checkpointer: issue 44)
    """Set up, resume, train and evaluate inside a started runtime; the run's summary. `run` owns the runtime
    and records a failure raised here."""
    clock = PhaseClock()
    out_dir = Path(cfg.out_dir)
    is_main = runtime.is_main
    train = cfg.train
    check_batch(cfg, runtime)
    # train.precision=auto: bf16 where this device has bf16 units, else fp32 (trm/precision.py); checked by every
    # worker below (they must agree), held by the checkpoint's identity, shown on the start line and the summary.
    facts = device_facts(runtime.device)
    chosen = resolve_precision(train.precision, facts, train.get("bf16_mode", "bf16"))
    compiling = compile_mode(train.compile)
    loss_divisor = runtime.loss_divisor(train.global_batch_size)  # examples one step's loss sums over
    torch.manual_seed(cfg.seed)

    # -------------------------------------------------------------------- data, model, optimizers
    train_arrays, test_arrays, train_meta, _ = load_data(cfg)
    arch = TRMConfig.from_dict(to_dict(cfg.arch), **train_meta.arch_fields())
    validate_curriculum(cfg.curriculum, arch.H_cycles, arch.L_cycles)
    kernels = resolve_kernels(  # trm/kernels.py
        train.kernels, runtime.device.type, chosen.mode, arch, facts.cuda_capability
    )
    check_agreement(
        runtime,
        {
            "config": config_fingerprint(cfg),
            "code": code_fingerprint(),
            "data": train_meta.fingerprint,
            "precision": chosen.mode,
        },
    )
    model = ACTModel(arch).to(runtime.device)
    if runtime.backend != "xla":  # XLA compiles the whole step anyway
        apply_kernels(model, kernels.choice)  # before compiling: torch.compile traces the choice
        apply_compile(model, compiling)  # net or the whole model: trm/compiling.py says which to choose
    optimizers = build_optimizers(model, cfg.optim)
    ema = build_ema(model, cfg.optim.ema_decay) if train.ema else None
    loader = TrainLoader(train_arrays, train.global_batch_size, runtime.rank, runtime.world_size, seed=cfg.seed)
    eval_set = functools.partial(
        eval_batches, test_arrays, train.eval_batch_size // runtime.world_size, runtime.rank, runtime.world_size
    )
    step_model = runtime.wrap_model(model)

    # -------------------------------------------------------------------------------- resume
    state = TrainState(
        model,
        optimizers,
        ema,
        loader,
        identity={"config": training_identity(cfg, chosen.mode), "data": train_meta.fingerprint},
        best=Best.start(train.objective_direction),
        train_sums=torch.zeros(len(METRIC_KEYS), device=runtime.device),
    )
    if cfg.checkpoint.resume:
        train_state.resume(runtime, state, cfg.checkpoint.url, check_best=cfg.checkpoint.keep_best)

    # ------------------------------------------------------------------------------- outputs
    params = count_params(model)
    if is_main:  # measured once, for the trial's compute estimate (accuracy vs compute studies)
        params["flops_per_sample_step"] = flops_per_sample_step(arch, arch.H_cycles, arch.L_cycles)
        out_dir.mkdir(parents=True, exist_ok=True)
        start = {
            "event": "start",
            "resumed_from": state.step,
            "world_size": runtime.world_size,
            "device": str(runtime.device),  # runtime.device resolved (auto: the GPU when torch sees one)
            "precision": chosen.mode,
            "precision_reason": chosen.reason,
            "kernels": f"{kernels.choice} ({kernels.reason})",
            **params,
        }
        print(json.dumps(start), flush=True)
    metrics_file = open_metrics(out_dir) if is_main else None
    total = train.steps
    bar = tqdm(
        total=total, initial=state.step, disable=not (is_main and train.progress), desc="train", dynamic_ncols=True
    )
    log = RunLog(out_dir, metrics_file, make_tracker(cfg, is_main, params, chosen))

    # ---------------------------------------------------------------------------------- loop
    # The step's settings as plain values, read once (the step is the hot path).
    precision, loss, grad_clip = chosen.mode, train.loss, train.grad_clip
    outcome = Outcome()
    timer = StepTimer()  # steady-state step time, for the trial's `throughput` (trm/throughput.py)
    preemption = PreemptionFlag()
    profiler = StepProfiler(
        profile_window(train.profile_steps) if is_main else None, out_dir, runtime.backend, runtime.device
    )
    if is_main and reporter is not None:
        reporter.progress(state.step)  # set up (data, model, resume): the first steps may compile for a while
    try:
        for step in range(state.step, total):
            profiler.before_step(step)
            progress = step / total
            cycles = recursion_at(progress, cfg.curriculum, arch.H_cycles, arch.L_cycles)
            exploration = torch.tensor(exploration_at(progress, cfg.halting), device=runtime.device)
            set_lr(optimizers, lr_multiplier(step, cfg.optim.warmup_steps, total, cfg.optim.lr_min_ratio))
            batch = runtime.to_device(next(loader))
            clock.stamp_once("first_step_start")
            if state.carry is None:
                state.carry = model.initial_carry(batch, carry_dtype(precision))
            state.carry, metrics = train_step(
                step_model,
                state.carry,
                batch,
                exploration,
                cycles,
                optimizers,
                precision=precision,
                loss=loss,
                grad_clip=grad_clip,
                loss_divisor=loss_divisor,
            )
            if ema is not None:
                update_ema(ema, model)
            runtime.step_boundary()
            state.train_sums += metrics  # stays on the device: read only at log points
            state.step = done = step + 1
            profiler.after_step(done)
            clock.stamp_once("first_step_end")
            clock.stamp("last_step_end")
            bar.update(1)

            if done % train.log_interval == 0 or done == total:
                record = train_record(runtime, state, optimizers, cycles)  # waits for the device
                compile_warning = timer.mark(done)
                if compile_warning and is_main:
                    print(compile_warning, file=sys.stderr, flush=True)
                with timer.excluded():  # logging and the progress write to the study are not step time
                    log.log({"step": done, **record})
                    if is_main and reporter is not None:
                        reporter.progress(done)
                    bar.set_postfix(loss=f"{record['train/lm_loss']:.3f}", acc=f"{record['train/accuracy']:.3f}")

            if done % train.eval_interval == 0 or done == total:
                with timer.excluded():  # evals and checkpoints are not step time
                    eval_model = cast(ACTModel, ema.module) if (ema is not None and train.eval_with_ema) else model
                    state.last_eval = evaluate(
                        eval_model, eval_set(train.eval_examples), runtime, cycles, precision=precision, loss=loss
                    )
                    log.log({"step": done, **state.last_eval})
                    value = state.last_eval[train.objective]
                    improved = state.best.update(value, done, state.last_eval)
                    to_best = cfg.checkpoint.keep_best and state.best_file.takes(
                        value, done, improved, state.best.maximize
                    )
                    verdict = (
                        reporter.report(done, state.last_eval) if (is_main and reporter is not None) else "continue"
                    )
                    verdict = runtime.broadcast_object(verdict)  # every rank stops at the same step
                    if verdict != "abandon":
                        train_state.save(runtime, state, cfg.checkpoint, best=to_best)
                if verdict == "abandon":
                    outcome.status = ABANDONED
                    break
                if verdict == "prune":
                    outcome.status = PRUNED
                    break
            elif done == train.stop_after:
                train_state.save(runtime, state, cfg.checkpoint, best=False)
            if done == train.stop_after:
                break
            if done % train.preemption_check_interval == 0 and any(runtime.all_gather_object(preemption.raised)):
                # A VM got SIGTERM (preemption notice): save while we still can.
                train_state.save(runtime, state, cfg.checkpoint, best=False)
                outcome.status = PREEMPTED
                break
        clock.stamp("train_end")  # after the last step's eval and checkpoint: training work ends here
        outcome.rank_steps = train_state.finish(runtime, state, cfg.checkpoint)  # the last upload landed; every step
    except Exception as err:  # record why (once an upload in flight landed, within its grace), then let it propagate
        train_state.failed(state, cfg.checkpoint, outcome, err)
        raise
    finally:
        preemption.restore()
        bar.close()
        throughput = timer.summary(params.get("flops_per_sample_step", 0), train.global_batch_size, runtime.devices)
        summary = summarize(cfg, state, outcome, clock, params, chosen, str(runtime.device), throughput)
        summary.update(profile=profiler.close(), peak_memory_mb=peak_memory_mb(runtime.device))  # trace written
        log.close(summary)
        clock.stamp("end")  # after the W&B run is closed: what is left is the outcome write and exit
        if is_main and reporter is not None:
            reporter.record_outcome(outcome.status, summary)
    return summary


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
    cfg: DictConfig,
    state: TrainState,
    outcome: Outcome,
    clock: PhaseClock,
    params: dict[str, int],
    precision: Precision,
    device: str,
    throughput: dict[str, Any] | None,
) -> dict[str, Any]:
    """The run's summary: summary.json, the `end` line, the tracker's summary and what the trial stores."""
    return {
        "outcome": outcome.status,
        "error": outcome.error,
        "steps": state.step,
        "rank_steps": outcome.rank_steps,
        "retryable": outcome.retryable,
        "run_again": outcome.run_again,
        "objective": cfg.train.objective,
        "precision": precision.mode,  # what train.precision resolved to (auto: from the device), and why
        "precision_reason": precision.reason,
        "device": device,  # what runtime.device resolved to on rank 0 (cpu, cuda:0; xla for the XLA backend)
        "best_value": state.best.found_value,
        "best_step": state.best.step,
        "best_checkpoint": state.best_file.to_dict() | {"note": state.best_file.note},  # what best.pt holds
        "final": state.last_eval,
        "seconds": clock.seconds(),
        "timing": clock.stamps,  # the live dict: `end` is stamped after the files are written
        "compute_flops": params.get("flops_per_sample_step", 0) * cfg.train.global_batch_size * state.step,
        "throughput": throughput,  # steady-state step speed (trm/throughput.py); None for a run too short to time
        **params,
    }


@hydra.main(config_path=CONFIG_PATH, config_name="train", execution_whitelist=HYDRA_CALLBACKS)
def main(cfg: DictConfig) -> float | None:
    """Train; return the run's objective (`train.objective`, best over its evals) and nothing else, so that Hydra's
    own sweepers (hydra-optuna-sweeper: `python -m trm.train -m hydra/sweeper=optuna ...`) can optimize it.
    With reeval.run=true: evaluate the run's checkpoint again instead (trm/reeval.py, which imports this module)."""
    train_config.check_train_config(cfg)  # the ranges (Hydra checked keys, types and choices as it composed)
    if cfg.reeval.run:
        from trm import reeval

        return reeval.run(cfg).value
    value = run(cfg).get("best_value")
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
