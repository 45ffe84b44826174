"""Adam-atan2 exactly as the TRM reference trains with it: the `adam-atan2` CUDA kernel (0.0.3).

Hand-written because no library computes this update on every device: the kernel itself builds for CUDA only,
and `adam-atan2-pytorch` puts the first bias correction inside the atan2, which makes the first ~50 updates
smaller (the first is 0.79 lr instead of 1.0 lr). Per step t, for each parameter p with gradient g:

    p *= 1 - lr * weight_decay
    m  = lerp(m, g, 1 - b1);   v = lerp(v, g^2, 1 - b2)
    p -= (lr / (1 - b1^t)) * atan2(m, sqrt(v) / sqrt(1 - b2^t))

atan2 needs no epsilon: the update is bounded by pi/2 * lr even when v is 0. Tested against the kernel's
recorded updates (tests/test_fidelity.py).

The step's scalars (lr, weight decay, betas, bias corrections) are computed as Python floats, in double, as
the kernel's host code does. On the CPU/GPU they are used as such. On XLA they are device data of the same (fp32-rounded)
values (`graph_scalars`): torch_xla already uploads a Python float as data, but turns 0 and +-1 into constants
and shares one parameter between equal floats, so a trial whose lr * weight_decay or beta2 happens to equal
another scalar of the step (lr, 1 - ema_decay, ...) traces another graph and compiles it again. As data,
trials that differ only in these values run the same compiled step (tests/xla/test_compile_cache.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer


def graph_scalars(like: Tensor, *values: float) -> tuple[float | Tensor, ...]:
    """`values` unchanged off XLA; on XLA `device_scalars(like, *values)`."""
    if like.device.type != "xla":
        return values
    return device_scalars(like, *values)


def device_scalars(like: Tensor, *values: float) -> tuple[Tensor, ...]:
    """`values` as the 0-dim elements of one 1-D tensor uploaded to `like`'s device and dtype (one transfer).
    Not 0-dim uploads: torch_xla passes those, like Python floats, through its scalar data cache (equal values
    share a parameter, 0 and 1 become constants); elements of a vector are data, each its own. Same numbers:
    torch_xla rounds a Python float operand to the tensor's dtype too."""
    return tuple(torch.tensor(list(values), dtype=like.dtype, device=like.device).unbind())


class AdamAtan2(Optimizer):
    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.95),
        weight_decay: float = 0.0,
    ):
        if lr <= 0:
            raise ValueError(f"optim.lr={lr}: must be > 0")
        if not all(0.0 <= beta < 1.0 for beta in betas):
            raise ValueError(f"optim.betas={list(betas)}: each must be in [0, 1)")
        if weight_decay < 0:
            raise ValueError(f"optim.weight_decay={weight_decay}: must be >= 0")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            beta1, beta2 = group["betas"]
            scalars: dict[int, tuple[float | Tensor, ...]] = {}  # per step count t (in practice one per group)
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"]
                if t not in scalars:
                    scalars[t] = graph_scalars(
                        p, 1 - lr * wd, 1 - beta1, 1 - beta2, math.sqrt(1 - beta2**t), lr / (1 - beta1**t)
                    )
                decay, weight1, weight2, correction2, step_size = scalars[t]
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                p.mul_(decay)
                exp_avg.lerp_(p.grad, weight1)
                exp_avg_sq.lerp_(p.grad * p.grad, weight2)
                denominator = exp_avg_sq.sqrt() / correction2
                # mul_ rather than add_(alpha=...): a step size beyond the dtype's range (a diverging lr) gives
                # inf/NaN weights that the trainer reports, not an error inside the optimizer.
                p.sub_(torch.atan2(exp_avg, denominator).mul_(step_size))
        return loss
