"""A training run's set-up, inside a started runtime: the data, the model and its optimizers, the resume; what
the loop needs (`Trainer`), built once by `setup` (trm/train.py runs the loop over it).

Every worker checks that all agree on config, code, data and precision before it builds the model; the checkpoint
the run resumes from must have been written by the same training (trm/checkpoints/checkpoint.py `check_identity`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass

import torch

from contracts.choices import compile_mode
from contracts.hydra_app import TrainJob
from contracts.train_config import TrainApp
from trm.checkpointer import Checkpointer
from trm.compiling import apply_compile
from trm.data.loader import EvalBatches, TrainLoader, eval_batches
from trm.fingerprint import code_fingerprint, config_fingerprint, training_identity
from trm.flops import flops_per_sample_step
from trm.job_inputs import check_batch, load_data, out_dir
from trm.kernel_choice import apply_kernels, launchable, resolve_kernels
from trm.losses import METRIC_KEYS
from trm.measures.clock import PhaseClock
from trm.model import ACTModel, TRMConfig, count_params
from trm.optim import build_ema, build_optimizers
from trm.precision import Precision, device_facts, resolve_precision
from trm.runtime.base import Runtime, check_agreement
from trm.schedules import validate_curriculum
from trm.train_state import Best, TrainState


@dataclass
class Trainer:
    """What the loop needs, built once by `setup`: the model, its optimizers, EMA and data position live in `state`,
    which `checkpointer` resumes and saves; `params` holds the counts (rank 0: and FLOPs) the summary reports."""

    job: TrainJob  # the typed config (`cfg`), and as written: the W&B run's config (trm/tracking/tracker.py)
    runtime: Runtime
    clock: PhaseClock  # started before the set-up: `run_start`
    arch: TRMConfig
    chosen: Precision  # what train.precision resolved to, and why
    state: TrainState
    checkpointer: Checkpointer
    step_model: torch.nn.Module  # what the train step calls (DDP for `torch`); state.model is the one saved
    eval_set: Callable[[int | None], EvalBatches]  # this rank's share of the first N test examples
    params: dict[str, int]
    # The step's settings as plain values, read once (the step is the hot path).
    loss: str
    grad_clip: float
    loss_divisor: int  # examples one step's loss sums over

    @property
    def cfg(self) -> TrainApp:
        """The run's config, typed."""
        return self.job.app


def setup(job: TrainJob, runtime: Runtime) -> Trainer:
    """Data, model, optimizers and the resume, inside a started runtime; rank 0 prints the `start` line."""
    clock = PhaseClock()
    is_main = runtime.is_main
    cfg = job.app
    train = cfg.train
    local_batch = check_batch(train, runtime)
    # train.precision=auto: bf16 where this device has bf16 units, else fp32 (trm/precision.py); checked by every
    # worker below (they must agree), held by the checkpoint's identity, shown on the start line and the summary.
    facts = device_facts(runtime.device)
    chosen = resolve_precision(train.precision, facts, train.bf16_mode)
    compiling = compile_mode(train.compile)
    loss_divisor = runtime.loss_divisor(train.global_batch_size)
    torch.manual_seed(cfg.seed)

    # -------------------------------------------------------------------- data, model, optimizers
    train_arrays, test_arrays, train_meta, _ = load_data(cfg.data)
    arch = TRMConfig.from_dict(cfg.arch, **train_meta.arch_fields())
    validate_curriculum(cfg.curriculum, arch.H_cycles, arch.L_cycles)
    kernels = resolve_kernels(  # trm/kernel_choice.py
        train.kernels, runtime.device.type, chosen.mode, arch, facts.cuda_capability
    )
    # A fused choice that cannot launch on this GPU keeps torch's kernels from here, with one warning (on a GPU the
    # trial runs the step's batch: Triton tunes its tiles for it; the interpreter's trial, one row).
    trial_batch = local_batch if runtime.device.type == "cuda" else 1
    kernels = launchable(kernels, arch, runtime.device, chosen.mode, trial_batch)
    check_agreement(
        runtime,
        {
            "config": config_fingerprint(job.written),
            "code": code_fingerprint(),
            "data": train_meta.fingerprint,
            "precision": chosen.mode,
            "kernels": kernels.choice,  # a trial launch may fall back on one worker's GPU
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
        identity={"config": training_identity(job.written, chosen.mode), "data": train_meta.fingerprint},
        best=Best.start(train.objective_direction),
        train_sums=torch.zeros(len(METRIC_KEYS), device=runtime.device),
    )
    checkpointer = Checkpointer(runtime, state, cfg.checkpoint)
    if cfg.checkpoint.resume:
        checkpointer.resume()

    # ------------------------------------------------------------------------------ the start
    params = count_params(model)
    if is_main:  # measured once, for the trial's compute estimate (accuracy vs compute studies)
        params["flops_per_sample_step"] = flops_per_sample_step(arch, arch.H_cycles, arch.L_cycles)
        out_dir(cfg).mkdir(parents=True, exist_ok=True)
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
    return Trainer(
        job=job,
        runtime=runtime,
        clock=clock,
        arch=arch,
        chosen=chosen,
        state=state,
        checkpointer=checkpointer,
        step_model=step_model,
        eval_set=eval_set,
        params=params,
        loss=train.loss,
        grad_clip=train.grad_clip,
        loss_divisor=loss_divisor,
    )
