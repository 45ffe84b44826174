"""Shared pieces of the bench scripts: the real train step on synthetic Sudoku-shaped batches, a dense matmul
peak, machine facts and medians. The machine is shared and noisy, so every script interleaves its variants
round-robin and reports medians."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from bench._results import RESULTS, ROOT, cpu_facts, median  # noqa: F401  (re-exported for the trainer scripts)
from contracts.choices import compile_mode
from contracts.hydra_app import compose_train_config
from trm.compiling import apply_compile
from trm.data.format import NUM_PUZZLE_IDENTIFIERS, SEQ_LEN, VOCAB_SIZE
from trm.kernel_choice import apply_kernels
from trm.model import ACTModel, Carry, TRMConfig, count_params
from trm.optim import build_optimizers, lr_multiplier, set_lr
from trm.step import train_step


def machine_info() -> dict[str, Any]:
    """cpu_facts() plus what the trainer numbers depend on: vector/matrix extensions, torch and its threads."""
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")
    return {
        **cpu_facts(),
        "cpu_flags": [f for f in wanted if f in flags],
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        # libgomp spins (ACTIVE) by default; on a shared, oversubscribed CPU that costs multiples (see docs).
        "env": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")},
    }


def sudoku_batch(batch: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tokens with the Sudoku dataset's shapes and vocabulary (compute does not depend on values)."""
    g = torch.Generator().manual_seed(seed)
    return {
        "inputs": torch.randint(1, VOCAB_SIZE, (batch, SEQ_LEN), generator=g),  # 1 = blank, 2..10 digits
        "labels": torch.randint(2, VOCAB_SIZE, (batch, SEQ_LEN), generator=g),
        "puzzle_identifiers": torch.zeros(batch, dtype=torch.long),
    }


def train_config(arch: str, batch: int, precision: str, extra: list[str] = ()) -> DictConfig:
    return compose_train_config(
        [f"arch={arch}", f"train.global_batch_size={batch}", f"train.precision={precision}", *extra]
    )


def arch_of(cfg: DictConfig) -> TRMConfig:
    return TRMConfig.from_dict(
        OmegaConf.to_container(cfg.arch, resolve=True),
        vocab_size=VOCAB_SIZE,
        seq_len=SEQ_LEN,
        num_puzzle_identifiers=NUM_PUZZLE_IDENTIFIERS,
    )


@dataclass
class StepRunner:
    """One variant: its own model, optimizers and carry, stepped by the real `trm.step.train_step`."""

    name: str
    cfg: DictConfig
    batch_size: int
    compile: str = "off"  # a train.compile choice (trm/compiling.py): off | net | model (every H/L cycle in one graph)
    kernels: str = "torch"  # a concrete train.kernels choice, not auto (trm/kernel_choice.py)
    state_dtype: torch.dtype = torch.float32
    seed: int = 0
    device: str = "cpu"  # cpu | cuda: the model, optimizer state, carry and batch live there
    times: list[float] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)  # round index of each entry of times
    first_step_s: float | None = None
    first_lm_loss: float | None = None  # mean lm_loss of the first step: same seed/batch/carry in every variant
    error: str | None = None
    last_metrics: torch.Tensor | None = None  # the last step's summed metrics (METRIC_KEYS), on the device, unread

    def __post_init__(self) -> None:
        torch.manual_seed(self.seed)
        self.arch = arch_of(self.cfg)
        self.model = ACTModel(self.arch).to(self.device).train()
        self.optimizers = build_optimizers(self.model, OmegaConf.to_object(self.cfg.optim))  # typed: its schema's
        set_lr(
            self.optimizers,
            lr_multiplier(0, self.cfg.optim.warmup_steps, self.cfg.train.steps, self.cfg.optim.lr_min_ratio),
        )
        apply_kernels(self.model, self.kernels)  # before compiling, as the trainer does
        apply_compile(self.model, compile_mode(self.compile))  # in place, as the trainer does
        self.batch = {k: v.to(self.device) for k, v in sudoku_batch(self.batch_size, self.seed).items()}
        self.carry: Carry = self.model.initial_carry(self.batch, self.state_dtype)
        self.exploration = torch.tensor(float(self.cfg.halting.exploration_prob), device=self.device)
        self.cycles = (self.arch.H_cycles, self.arch.L_cycles)
        self.params = count_params(self.model)

    def step(self) -> float:
        start = time.perf_counter()
        self.carry, metrics = train_step(
            self.model,
            self.carry,
            self.batch,
            self.exploration,
            self.cycles,
            self.optimizers,
            precision=self.cfg.train.precision,
            loss=self.cfg.train.loss,
            grad_clip=self.cfg.train.grad_clip,
            loss_divisor=self.batch_size,
        )
        self.last_metrics = metrics
        metrics.sum().item()  # waits for the step's last kernel on a GPU (the previous step's read did the same)
        seconds = time.perf_counter() - start
        if self.first_step_s is None:
            self.first_step_s = seconds  # includes compilation for compiled variants
        if self.first_lm_loss is None:
            self.first_lm_loss = self.last_lm_loss()
        return seconds

    def last_lm_loss(self) -> float:
        """The mean lm_loss of the last step (a read of the device)."""
        assert self.last_metrics is not None, "no step has run"
        return float(self.last_metrics[7]) / self.batch_size  # METRIC_KEYS[7] == "lm_loss"


MATMUL_LAYOUTS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "nn": torch.matmul,
    "nt": lambda a, b: torch.matmul(a, b.t()),  # a Linear's forward: x @ W^T
    "tn": lambda a, b: torch.matmul(a.t(), b),  # a Linear's weight gradient: dY^T @ X
}


def matmul_rate(dtype: torch.dtype, n: int, min_seconds: float, layout: str = "nn", device: str = "cpu") -> float:
    """Dense torch.matmul FLOP/s of an n x n x n product, averaged over >= min_seconds (after one warmup).
    `layout` transposes an operand (MATMUL_LAYOUTS): fp32 runs every layout alike, but bf16 on a CPU without
    avx512_bf16/amx_bf16 runs nn ~10x slower than nt/tn (docs/benchmarks.md, Trainer vs the reference).
    On a GPU every product is waited for (random data, never zeros: zeros run faster on some GPUs)."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    product = MATMUL_LAYOUTS[layout]
    sync = torch.cuda.synchronize if a.is_cuda else (lambda: None)
    product(a, b)
    sync()
    iters, start = 0, time.perf_counter()
    while True:
        product(a, b)
        sync()
        iters += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds and iters >= 2:
            return 2 * n**3 * iters / elapsed


def round_robin(items: list[Any], rounds: int, run: Callable[[Any, int], None]) -> None:
    """Run every item once per round; the order rotates each round so no item always follows another."""
    for r in range(rounds):
        shift = r % len(items)
        for item in items[shift:] + items[:shift]:
            run(item, r)


STEP_PROFILE_KEYS = ("arch", "batch", "precision", "compile", "steps")  # what a step profile's result records


def step_profile_parser(doc: str | None, batch: int, warmup: int, steps: int, out_name: str) -> argparse.ArgumentParser:
    """The arguments of the step profiles (bench/trainer/cpu_profile.py, bench/gpu/profile.py): the paper preset's step at
    one precision and compile mode, profiled for --steps after --warmup."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    p.add_argument("--arch", default="trm_mlp_t_sudoku")
    p.add_argument("--batch", type=int, default=batch)
    p.add_argument("--precision", default="bf16_reference", help="train.precision (fp32 | bf16 | bf16_reference)")
    p.add_argument("--compile", default="model", choices=("off", "net", "model"), help="train.compile")
    p.add_argument("--warmup", type=int, default=warmup)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--out-name", default=out_name)
    return p
