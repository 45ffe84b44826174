"""Optimizers and the learning-rate schedule.

The dense weights use Adam-atan2 (the reference's kernel, trm/adam_atan2.py), AdamW or Lion (torch's and
lion-pytorch's, with their scalars as data on XLA: trm/xla_optim.py; one `conf/optim/*.yaml` each); the puzzle
embedding uses SignSGD, as in the TRM reference. EMA comes from torch.optim.swa_utils, started and restricted as
the reference's is (build_ema, update_ema).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from contracts.train_config import AdamWConfig, OptimConfig
from trm.adam_atan2 import AdamAtan2, graph_scalars
from trm.xla_optim import AdamW, Lion

PUZZLE_EMB = "puzzle_emb"  # parameters with this in their name: SignSGD, and no EMA


def is_puzzle_emb(name: str) -> bool:
    return PUZZLE_EMB in name


class SignSGD(Optimizer):
    """p <- p * (1 - lr * wd) - lr * sign(grad), decaying only the rows that received a gradient.

    Hand-written because no library offers it: the puzzle embedding is a table of which a batch touches a
    few rows, and decaying the untouched rows (as a dense optimizer would) is not what TRM trains.
    Differs from the reference in one corner (docs/fidelity.md): a row present in the batch whose gradient is
    exactly zero is not decayed here (the reference decays it); with Sudoku's single puzzle id this never
    happens."""

    def __init__(self, params: Any, lr: float, weight_decay: float = 0.0):
        if lr <= 0:
            raise ValueError(f"optim.puzzle_emb_lr={lr}: must be > 0")
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update; `closure` (torch's optimizer protocol: re-evaluates the loss) is called first if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                touched = (p.grad != 0).any(dim=-1, keepdim=True).to(p.dtype)
                if p.device.type == "xla":  # the same update with lr and wd as data (graph_scalars)
                    lr_wd, step = graph_scalars(p, lr * wd, lr)
                    p.mul_(1 - lr_wd * touched)
                    p.sub_(torch.sign(p.grad) * step)  # sign is -1/0/1: the product is exact, as alpha=-lr's
                    continue
                p.mul_(1 - lr * wd * touched)
                p.add_(torch.sign(p.grad), alpha=-lr)
        return loss


def build_optimizers(model: nn.Module, optim_cfg: OptimConfig) -> list[Optimizer]:
    """The dense optimizer (first) and SignSGD over the puzzle embedding. `optim_cfg`'s values are checked by its
    schema (contracts/train_config.py OptimConfig; `optim.name`'s Literal names the three)."""
    name = optim_cfg.name
    dense = [p for n, p in model.named_parameters() if not is_puzzle_emb(n)]
    emb = [p for n, p in model.named_parameters() if is_puzzle_emb(n)]
    lr, wd, (beta1, beta2) = optim_cfg.lr, optim_cfg.weight_decay, optim_cfg.betas  # two: the schema's check
    if name == "adam_atan2":
        main: Optimizer = AdamAtan2(dense, lr=lr, betas=(beta1, beta2), weight_decay=wd)
    elif name == "adamw":
        main = AdamW(dense, lr=lr, betas=(beta1, beta2), weight_decay=wd, eps=_adamw_eps(optim_cfg))
    else:  # "lion"
        main = Lion(dense, lr=lr, betas=(beta1, beta2), weight_decay=wd)
    optimizers = [main]
    if emb:
        optimizers.append(SignSGD(emb, lr=optim_cfg.puzzle_emb_lr, weight_decay=optim_cfg.puzzle_emb_weight_decay))
    for opt in optimizers:
        for group in opt.param_groups:
            group["base_lr"] = group["lr"]
    return optimizers


def _adamw_eps(optim_cfg: OptimConfig) -> float:
    """AdamW's eps: a key of optim=adamw's schema only, so `optim.name=adamw` on another option has none."""
    if not isinstance(optim_cfg, AdamWConfig):
        raise ValueError("optim.name=adamw: its eps is optim=adamw's key; choose the option (optim=adamw)")
    return optim_cfg.eps


def lr_multiplier(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Multiplier for the update of 0-based `step`: linear warmup, then cosine down to min_ratio.

    The reference counts updates from 1 and evaluates its schedule at that count, so update `step` uses
    n = step + 1: n / warmup during warmup (never 0: the first update has lr / warmup), then the cosine at
    progress (n - warmup) / (total - warmup)."""
    n = step + 1
    if n < warmup_steps:
        return n / warmup_steps
    progress = min(1.0, (n - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def set_lr(optimizers: list[Optimizer], multiplier: float) -> None:
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["base_lr"] * multiplier


def build_ema(model: nn.Module, decay: float) -> AveragedModel:
    """An EMA of the weights that starts from the initial weights, as the reference's does.

    AveragedModel copies the weights at its first update; that update happens here, before training, so
    the average after n steps is decay^n * initial + ... (not decay^(n-1) * the step-1 weights)."""
    avg_fn = get_ema_multi_avg_fn(decay)  # also checks 0 <= decay <= 1
    if any(p.device.type == "xla" for p in model.parameters()):
        avg_fn = _ema_as_data(decay)
    ema = AveragedModel(model, multi_avg_fn=avg_fn, use_buffers=True)
    ema.update_parameters(model)
    return ema


def _ema_as_data(decay: float) -> Callable[..., None]:
    """get_ema_multi_avg_fn's update (lerp towards the model by 1 - decay) with 1 - decay as an XLA tensor, made
    once: torch's passes a Python float, which torch_xla shares with any equal scalar of the step (e.g. 1 - beta1
    when decay == beta1), so another decay could trace another graph (trm/adam_atan2.py, graph_scalars)."""
    weights: dict[tuple[torch.device, torch.dtype], Tensor] = {}

    @torch.no_grad()
    def ema_update(ema_params: list[Tensor], model_params: list[Tensor], _num_averaged: Any) -> None:
        for ema_param, param in zip(ema_params, model_params):
            if not (torch.is_floating_point(ema_param) or torch.is_complex(ema_param)):
                ema_param.copy_(ema_param * decay + param * (1 - decay))  # as torch's, for integer buffers
                continue
            key = (ema_param.device, ema_param.dtype)
            if key not in weights:
                (weights[key],) = cast(tuple[Tensor], graph_scalars(ema_param, 1 - decay))
            ema_param.lerp_(param, weights[key])

    return ema_update


@torch.no_grad()
def update_ema(ema: AveragedModel, model: nn.Module) -> None:
    """Average the weights after a step; the puzzle embedding is not averaged (eval reads the live table,
    as in the reference: a sparse table trained by SignSGD has no meaningful average)."""
    ema.update_parameters(model)
    averaged = dict(ema.module.named_parameters())
    for name, param in model.named_parameters():
        if is_puzzle_emb(name):
            averaged[name].copy_(param)
