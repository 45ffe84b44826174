"""Optimizers and the learning-rate schedule.

The dense weights use Adam-atan2, AdamW or Lion (one `conf/optim/*.yaml` each); the puzzle embedding
uses SignSGD, as in the TRM reference. EMA comes from torch.optim.swa_utils.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from adam_atan2_pytorch import AdamAtan2
from lion_pytorch import Lion
from torch import nn
from torch.optim import Optimizer
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

OPTIMIZERS = ("adam_atan2", "adamw", "lion")


class SignSGD(Optimizer):
    """p <- p * (1 - lr * wd) - lr * sign(grad), decaying only the rows that received a gradient.

    Hand-written because no library offers it: the puzzle embedding is a table of which a batch touches a
    few rows, and decaying the untouched rows (as a dense optimizer would) is not what TRM trains."""

    def __init__(self, params: Any, lr: float, weight_decay: float = 0.0):
        if lr <= 0:
            raise ValueError(f"optim.puzzle_emb_lr={lr}: must be > 0")
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                touched = (p.grad != 0).any(dim=-1, keepdim=True).to(p.dtype)
                p.mul_(1 - lr * wd * touched)
                p.add_(torch.sign(p.grad), alpha=-lr)


def build_optimizers(model: nn.Module, optim_cfg: Any) -> list[Optimizer]:
    """The dense optimizer (first) and SignSGD over the puzzle embedding."""
    name = optim_cfg.name
    dense = [p for n, p in model.named_parameters() if "puzzle_emb" not in n]
    emb = [p for n, p in model.named_parameters() if "puzzle_emb" in n]
    lr, wd, betas = float(optim_cfg.lr), float(optim_cfg.weight_decay), tuple(optim_cfg.betas)
    if lr <= 0:
        raise ValueError(f"optim.lr={lr}: must be > 0")
    if name == "adam_atan2":
        # a = b = 1 as the reference runs it (the library's default a = 1.27 scales every update).
        main: Optimizer = AdamAtan2(dense, lr=lr, betas=betas, weight_decay=wd, a=float(optim_cfg.a), b=float(optim_cfg.b))
    elif name == "adamw":
        main = torch.optim.AdamW(dense, lr=lr, betas=betas, weight_decay=wd, eps=float(optim_cfg.eps))
    elif name == "lion":
        main = Lion(dense, lr=lr, betas=betas, weight_decay=wd)
    else:
        raise ValueError(f"optim.name={name!r}: expected one of {list(OPTIMIZERS)}")
    optimizers = [main]
    if emb:
        optimizers.append(SignSGD(emb, lr=float(optim_cfg.puzzle_emb_lr), weight_decay=float(optim_cfg.puzzle_emb_weight_decay)))
    for opt in optimizers:
        for group in opt.param_groups:
            group["base_lr"] = group["lr"]
    return optimizers


def lr_multiplier(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Linear warmup from 1/warmup (never 0: Adam-atan2 rejects lr = 0), then cosine down to min_ratio."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def set_lr(optimizers: list[Optimizer], multiplier: float) -> None:
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["base_lr"] * multiplier


def build_ema(model: nn.Module, decay: float) -> AveragedModel:
    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)
