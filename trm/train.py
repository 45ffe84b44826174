"""Train a Tiny Recursive Model: `python -m trm.train [arch=...] [optim=...] [key=value ...]`.

Read top to bottom: set up the runtime and data, build the model and optimizers, resume if a checkpoint
exists, then loop. Each step is one supervision step of deep supervision on a batch of carries; metrics
stay on the device and are read only at log/eval points (no host sync inside the step). Rank 0 alone
logs, evaluates the objective against the best so far, writes checkpoints and talks to the sweep.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn
from tqdm import tqdm

from trm import checkpoint
from trm.config import CONFIG_PATH
from trm.data.build import ensure_generated
from trm.data.format import DatasetError, load_split
from trm.data.loader import TrainLoader, eval_batches
from trm.fingerprint import code_fingerprint, config_fingerprint, training_identity
from trm.info import flops_per_sample_step
from trm.losses import METRIC_KEYS, act_loss, normalize_metrics
from trm.model import ACTModel, Carry, TRMConfig, count_params
from trm.optim import build_ema, build_optimizers, lr_multiplier, set_lr, update_ema
from trm.runtime import Runtime, RuntimeMismatchError, check_agreement, init_runtime
from trm.schedules import exploration_at, recursion_at, validate_curriculum
from trm.tracking import make_tracker
from trm.trial_link import link_from_config


class NonFiniteLossError(RuntimeError):
    pass


# Failures that running again would repeat (bad config, bad data, divergence, workers that disagree); any
# other failure (a lost peer, a dead connection, a full disk) is worth a retry from the last checkpoint.
NOT_RETRYABLE = (ValueError, TypeError, KeyError, NonFiniteLossError, RuntimeMismatchError)


class Reporter(Protocol):
    """Rank 0's link to whoever watches the run (a sweep trial).

    `report` returns the verdict: "continue", "prune" (stop, with a checkpoint) or "abandon" (stop at once:
    the trial was given to someone else). `progress` shows the run is alive (at start and every log point)."""

    def report(self, step: int, metrics: dict[str, float]) -> str: ...

    def progress(self, step: int) -> None: ...

    def finish(self, outcome: str, summary: dict[str, Any]) -> None: ...


# --------------------------------------------------------------------------------------------- setup


class PreemptionFlag:
    """SIGTERM (a preemption notice, a scheduler) sets a flag the loop checks every few steps, so every
    rank stops at the same step with a checkpoint instead of dying mid-write."""

    def __init__(self) -> None:
        self.raised = False
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.raised = True

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


def load_data(cfg: DictConfig) -> tuple[dict, dict, Any, Any]:
    """Build (generated) or open (path) the dataset on this worker's own disk; no shared filesystem."""
    data = cfg.data
    if data.source == "generate":
        ensure_generated(data.path, data.num_train, data.num_test, data.blanks, data.seed, num_aug=data.num_aug)
    elif data.source != "path":
        raise DatasetError(f"data.source={data.source!r}: expected 'generate' or 'path'")
    train_arrays, train_meta = load_split(data.path, "train")
    test_arrays, test_meta = load_split(data.path, "test")
    return train_arrays, test_arrays, train_meta, test_meta


def check_batch(cfg: DictConfig, runtime: Runtime) -> int:
    """Per-process batch size; the global batch must split evenly over the processes."""
    for key in ("global_batch_size", "eval_batch_size"):
        value = cfg.train[key]
        if value <= 0 or value % runtime.world_size:
            raise ValueError(
                f"train.{key}={value} is not divisible by the world size {runtime.world_size}: "
                f"use a positive multiple of {runtime.world_size}"
            )
    return cfg.train.global_batch_size // runtime.world_size


# train.precision -> (autocast dtype or None, dtype of the carry and so of the residual stream).
# "bf16": matmuls in bf16, the carry and residual sums in fp32 (autocast's own choice; our default for bf16).
# "bf16_reference": the TRM reference's forward_dtype=bfloat16: the carry and every activation in bf16, RMSNorm
# and RoPE computed in fp32 inside; the loss in fp32 either way (the reference uses float64, docs/fidelity.md).
PRECISIONS: dict[str, tuple[torch.dtype | None, torch.dtype]] = {
    "fp32": (None, torch.float32),
    "bf16": (torch.bfloat16, torch.float32),
    "bf16_reference": (torch.bfloat16, torch.bfloat16),
}


def _precision(precision: str) -> tuple[torch.dtype | None, torch.dtype]:
    if precision not in PRECISIONS:
        raise ValueError(f"train.precision={precision!r}: expected one of {list(PRECISIONS)}")
    return PRECISIONS[precision]


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    compute_dtype, _ = _precision(precision)
    return contextlib.nullcontext() if compute_dtype is None else torch.autocast(device.type, dtype=compute_dtype)


def carry_dtype(precision: str) -> torch.dtype:
    return _precision(precision)[1]


# ------------------------------------------------------------------------------------------ the step


def train_step(
    model: nn.Module,
    carry: Carry,
    batch: dict[str, Tensor],
    exploration: Tensor,
    cycles: tuple[int, int],
    optimizers: list[torch.optim.Optimizer],
    cfg: DictConfig,
    loss_divisor: int,
) -> tuple[Carry, Tensor]:
    """One supervision step on every slot of the carry. Returns the new carry and the metric sums."""
    with autocast(cfg.train.precision, carry.y.device):
        carry, logits, q_halt = model(carry, batch, exploration, *cycles)
    loss, metrics = act_loss(logits, q_halt, carry.labels, carry.inputs, carry.halted, carry.steps, cfg.train.loss)
    (loss / loss_divisor).backward()  # DDP averages over ranks; XLA SPMD sees the global batch
    if cfg.train.grad_clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
    for opt in optimizers:
        opt.step()
        opt.zero_grad(set_to_none=True)
    return carry, metrics


@torch.no_grad()
def evaluate(
    model: ACTModel, batches: Iterable[dict[str, Tensor]], cfg: DictConfig, runtime: Runtime, cycles: tuple[int, int]
) -> dict[str, float]:
    """Run every eval example through all halting steps; metrics summed over all ranks."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(len(METRIC_KEYS), device=runtime.device)
    for batch in batches:
        batch = runtime.to_device(batch)
        carry = model.initial_carry(batch, carry_dtype(cfg.train.precision))
        for _ in range(model.cfg.halt_max_steps):
            with autocast(cfg.train.precision, carry.y.device):
                carry, logits, q_halt = model(carry, batch, 0.0, *cycles)
        _, metrics = act_loss(
            logits, q_halt, carry.labels, carry.inputs, carry.halted, carry.steps, cfg.train.loss, valid=batch["valid"]
        )
        sums += metrics
        runtime.step_boundary()  # one bounded graph per eval batch on XLA
    model.train(was_training)
    return normalize_metrics(runtime.all_reduce_sum(sums).tolist(), "eval")


# ------------------------------------------------------------------------------------- checkpointing


def gather_rank_state(runtime: Runtime, carry: Carry) -> list[dict]:
    """Every rank's carry and RNG, so a resumed job continues exactly where each rank was."""
    mine = {"carry": {k: v.cpu() for k, v in carry._asdict().items()}, "rng": torch.get_rng_state()}
    return runtime.all_gather_object(mine)


def load_checkpoint(runtime: Runtime, url: str) -> dict | None:
    """Rank 0 reads the checkpoint (only it may see the path) and hands it to every rank: latest.pt, or
    previous.pt (with a warning naming both) when latest.pt cannot be read. If neither can, every rank raises
    rank 0's error, naming the files."""
    state, failure = None, None
    if runtime.is_main:
        try:
            state = checkpoint.load_latest(url)
        except checkpoint.CheckpointError as err:
            failure = err
    state, failure = runtime.broadcast_object((state, failure))
    if failure is not None:
        raise failure
    return state


# -------------------------------------------------------------------------------------------- run


def run(cfg: DictConfig, reporter: Reporter | None = None) -> dict[str, Any]:
    """Train to the end, to a pruning verdict, or to an error; return the summary (rank 0's is complete)."""
    runtime = init_runtime(cfg.runtime)
    clean = False
    try:
        if reporter is None and runtime.is_main:
            reporter = link_from_config(cfg)
        summary = _run(cfg, runtime, reporter)
        clean = True
        return summary
    except BaseException as err:
        # Failures before the loop (bad data, workers that disagree) reach the trial too.
        if reporter is not None:
            reporter.finish("FAIL", {"error": f"{type(err).__name__}: {err}"})
        raise
    finally:
        runtime.close(clean)  # no barrier after a failure: a dead peer would make it wait for the timeout


def _run(cfg: DictConfig, runtime: Runtime, reporter: Reporter | None) -> dict[str, Any]:
    started = time.time()
    # Wall-clock stamps (epoch seconds) of this run's phases: the sweep's overhead (interpreter and imports
    # before `run_start`, set-up before the first step, teardown after the last) is measured from them.
    # On XLA a step is dispatched asynchronously, so the step stamps mark dispatch, not completion.
    timing: dict[str, float] = {"run_start": started}
    out_dir = Path(cfg.out_dir)
    is_main = runtime.is_main
    check_batch(cfg, runtime)
    loss_divisor = runtime.loss_divisor(cfg.train.global_batch_size)  # examples one step's loss sums over
    torch.manual_seed(cfg.seed)

    train_arrays, test_arrays, train_meta, _ = load_data(cfg)
    arch = TRMConfig.from_dict(
        OmegaConf.to_container(cfg.arch, resolve=True),
        vocab_size=train_meta.vocab_size,
        seq_len=train_meta.seq_len,
        num_puzzle_identifiers=train_meta.num_puzzle_identifiers,
    )
    validate_curriculum(cfg.curriculum, arch.H_cycles, arch.L_cycles)
    check_agreement(
        runtime,
        {"config": config_fingerprint(cfg), "code": code_fingerprint(), "data": train_meta.fingerprint},
    )

    model = ACTModel(arch).to(runtime.device)
    if cfg.train.compile and runtime.backend != "xla":
        # Compile the recursed network only: 1.36x per bf16 step on CPU (bench/trainer_variants.py), a third
        # of the whole model's compile time, no recompile at curriculum stages, unchanged checkpoint keys.
        model.inner.net.compile()
    optimizers = build_optimizers(model, cfg.optim)
    ema = build_ema(model, cfg.optim.ema_decay) if cfg.train.ema else None
    loader = TrainLoader(train_arrays, cfg.train.global_batch_size, runtime.rank, runtime.world_size, seed=cfg.seed)
    eval_set = dict(
        arrays=test_arrays,
        batch_size_per_rank=cfg.train.eval_batch_size // runtime.world_size,
        rank=runtime.rank,
        world_size=runtime.world_size,
        max_examples=cfg.train.eval_examples,
    )
    step_model = runtime.wrap_model(model)

    maximize = cfg.train.objective_direction == "maximize"
    if cfg.train.objective_direction not in ("maximize", "minimize"):
        raise ValueError(
            f"train.objective_direction={cfg.train.objective_direction!r}: expected 'maximize' or 'minimize'"
        )
    start_step, best, carry = 0, {"value": -math.inf if maximize else math.inf, "step": None, "metrics": {}}, None
    last_eval: dict[str, float] = {}
    train_sums = torch.zeros(len(METRIC_KEYS), device=runtime.device)
    identity = {"config": training_identity(cfg), "data": train_meta.fingerprint}
    state = load_checkpoint(runtime, cfg.checkpoint.url) if cfg.checkpoint.resume else None
    if state is not None:
        checkpoint.check_identity(state, identity, f"{cfg.checkpoint.url.rstrip('/')}/{checkpoint.LATEST}")
        model.load_state_dict(state["model"])
        for opt, opt_state in zip(optimizers, state["optimizers"]):
            opt.load_state_dict(opt_state)
        if ema is not None and state.get("ema") is not None:
            ema.load_state_dict(state["ema"])
        loader.load_state_dict(state["loader"])
        mine = state["ranks"][runtime.rank]
        carry = Carry(**{k: v.to(runtime.device) for k, v in mine["carry"].items()})
        torch.set_rng_state(mine["rng"])
        start_step, best = state["step"], state["best"]
        train_sums = state["train_sums"].to(runtime.device)
        # A run resumed at its last step (its job finished, then its outcome was lost) trains nothing more:
        # its final eval is the one in the checkpoint, so the value a sweep reads is still that training's.
        last_eval = state.get("last_eval") or {}

    params = count_params(model)
    if is_main:  # measured once, for the trial's compute estimate (accuracy vs compute studies)
        params["flops_per_sample_step"] = flops_per_sample_step(arch, arch.H_cycles, arch.L_cycles)
    if is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        print(
            json.dumps({"event": "start", "resumed_from": start_step, "world_size": runtime.world_size, **params}),
            flush=True,
        )
    metrics_file = open(out_dir / "metrics.jsonl", "a") if is_main else None
    total = cfg.train.steps
    bar = tqdm(
        total=total, initial=start_step, disable=not (is_main and cfg.train.progress), desc="train", dynamic_ncols=True
    )

    tracker = make_tracker(cfg, is_main, params)

    def log(record: dict[str, Any]) -> None:
        if metrics_file is not None:
            metrics_file.write(json.dumps(record) + "\n")
            metrics_file.flush()
        tracker.log(record["step"], {k: v for k, v in record.items() if k != "step"})

    def save_checkpoint(improved: bool) -> None:
        """Collective (every rank sends its carry and RNG); rank 0 writes latest.pt and maybe best.pt."""
        ranks = gather_rank_state(runtime, carry)
        failure: tuple[bool, str] | None = None  # (non-finite weights?, message)
        if is_main:
            try:
                write_checkpoint(ranks, improved)
            except (checkpoint.CheckpointError, NonFiniteLossError) as err:
                failure = (isinstance(err, NonFiniteLossError), str(err))
        failure = runtime.broadcast_object(failure)  # every rank stops together if rank 0 could not save
        if failure is not None:
            non_finite, message = failure
            raise (NonFiniteLossError if non_finite else checkpoint.CheckpointError)(message)

    def write_checkpoint(ranks: list[dict], improved: bool) -> None:
        """Rank 0: refuse to save non-finite weights (the last good checkpoint stays), then write atomically."""
        if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
            raise NonFiniteLossError(
                f"non-finite weights at step {done}: no checkpoint written (the last good one is kept)"
            )
        state = {
            "step": done,
            "model": model.state_dict(),
            "ema": ema.state_dict() if ema is not None else None,
            "optimizers": [opt.state_dict() for opt in optimizers],
            "loader": loader.state_dict(),
            "ranks": ranks,
            "train_sums": train_sums.cpu(),
            "best": best,
            "last_eval": last_eval,
            checkpoint.IDENTITY: identity,
        }
        checkpoint.save(cfg.checkpoint.url, checkpoint.LATEST, state)
        if improved and cfg.checkpoint.keep_best:
            checkpoint.save(cfg.checkpoint.url, checkpoint.BEST, state)

    outcome, error, rank_steps, retryable = "COMPLETE", None, None, False
    done = start_step
    preemption = PreemptionFlag()
    if is_main and reporter is not None:
        reporter.progress(done)  # set up (data, model, resume): the first steps may compile for a while
    try:
        for step in range(start_step, total):
            progress = step / total
            cycles = recursion_at(progress, cfg.curriculum, arch.H_cycles, arch.L_cycles)
            exploration = torch.tensor(exploration_at(progress, cfg.halting), device=runtime.device)
            set_lr(optimizers, lr_multiplier(step, cfg.optim.warmup_steps, total, cfg.optim.lr_min_ratio))
            batch = runtime.to_device(next(loader))
            timing.setdefault("first_step_start", time.time())
            if carry is None:
                carry = model.initial_carry(batch, carry_dtype(cfg.train.precision))
            carry, metrics = train_step(step_model, carry, batch, exploration, cycles, optimizers, cfg, loss_divisor)
            if ema is not None:
                update_ema(ema, model)
            runtime.step_boundary()
            train_sums += metrics  # stays on the device: read only at log points
            done = step + 1
            timing.setdefault("first_step_end", time.time())
            timing["last_step_end"] = time.time()
            bar.update(1)

            if done % cfg.train.log_interval == 0 or done == total:
                reduced = normalize_metrics(runtime.all_reduce_sum(train_sums).tolist(), "train")
                train_sums.zero_()
                if not all(math.isfinite(reduced[f"train/{k}"]) for k in ("lm_loss", "q_halt_loss")):
                    raise NonFiniteLossError(
                        f"non-finite loss at step {done}: lm_loss={reduced['train/lm_loss']}, q_halt_loss={reduced['train/q_halt_loss']}"
                    )
                reduced.update(
                    {
                        "train/lr": optimizers[0].param_groups[0]["lr"],
                        "train/H_cycles": cycles[0],
                        "train/L_cycles": cycles[1],
                    }
                )
                log({"step": done, **reduced})
                if is_main and reporter is not None:
                    reporter.progress(done)
                bar.set_postfix(loss=f"{reduced['train/lm_loss']:.3f}", acc=f"{reduced['train/accuracy']:.3f}")

            if done % cfg.train.eval_interval == 0 or done == total:
                eval_model = ema.module if (ema is not None and cfg.train.eval_with_ema) else model
                last_eval = evaluate(eval_model, eval_batches(**eval_set), cfg, runtime, cycles)
                log({"step": done, **last_eval})
                value = last_eval[cfg.train.objective]
                improved = value > best["value"] if maximize else value < best["value"]
                if improved:
                    best = {"value": value, "step": done, "metrics": last_eval}
                verdict = reporter.report(done, last_eval) if (is_main and reporter is not None) else "continue"
                verdict = runtime.broadcast_object(verdict)  # every rank stops at the same step
                if verdict == "abandon":
                    outcome = "ABANDONED"
                    break
                save_checkpoint(improved)
                if verdict == "prune":
                    outcome = "PRUNED"
                    break
            elif done == cfg.train.stop_after:
                save_checkpoint(False)
            if done == cfg.train.stop_after:
                break
            if done % cfg.train.preemption_check_interval == 0 and any(runtime.all_gather_object(preemption.raised)):
                save_checkpoint(False)  # a VM got SIGTERM (preemption notice): save while we still can
                outcome = "PREEMPTED"
                break
        timing["train_end"] = time.time()  # after the last step's eval and checkpoint: training work ends here
        rank_steps = runtime.all_gather_object(done)  # proof that every rank stopped at the same step
    except Exception as err:  # record why, then let it propagate
        outcome, error = "FAIL", f"{type(err).__name__}: {err}"
        retryable = not isinstance(err, NOT_RETRYABLE)
        raise
    finally:
        preemption.restore()
        bar.close()
        summary = {
            "outcome": outcome,
            "error": error,
            "steps": done,
            "rank_steps": rank_steps,
            "retryable": retryable,
            "objective": cfg.train.objective,
            "best_value": best["value"] if best["step"] is not None else None,
            "best_step": best["step"],
            "final": last_eval,
            "seconds": round(time.time() - started, 2),
            "timing": timing,
            "compute_flops": params.get("flops_per_sample_step", 0) * cfg.train.global_batch_size * done,
            **params,
        }
        if metrics_file is not None:
            # Best-effort: a full or read-only out_dir must not replace the error that ended the run (nor keep the
            # tracker and the trial from recording the real outcome); a failed write is a warning on stderr.
            try:
                metrics_file.close()
                (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
            except OSError as write_err:
                print(
                    f"warning: could not write metrics.jsonl / summary.json in {out_dir} ({type(write_err).__name__}: "
                    f"{write_err}); the run ended {outcome}" + (f": {error}" if error else ""),
                    file=sys.stderr,
                    flush=True,
                )
            print(json.dumps({"event": "end", **summary}), flush=True)
        tracker.finish(summary)
        timing["end"] = time.time()  # after the W&B run is closed: what is left is the outcome write and exit
        if is_main and reporter is not None:
            reporter.finish(outcome, summary)
    return summary


@hydra.main(config_path=CONFIG_PATH, config_name="train", execution_whitelist=["storage.hydra_secrets.RefuseSecrets"])
def main(cfg: DictConfig) -> float | None:
    """Train; return the run's objective (`train.objective`, best over its evals) and nothing else, so that Hydra's
    own sweepers (hydra-optuna-sweeper: `python -m trm.train -m hydra/sweeper=optuna ...`) can optimize it."""
    value = run(cfg).get("best_value")
    return None if value is None else float(value)


if __name__ == "__main__":
    main()  # a failure exits inside (Hydra prints it and exits 1): past this line the run finished cleanly
    # Leave without the interpreter's teardown: everything is written and closed, and (1) torch's gloo threads
    # sometimes aborted a finished rank of a multi-process job at exit ("terminate called without an active
    # exception", SIGABRT) during C++ static destructors, (2) the teardown of torch and W&B cost a sweep trial
    # about a second between its outcome being stored and the driver seeing the job end (bench/sweep_overhead.py).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
