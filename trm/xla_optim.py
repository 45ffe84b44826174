"""torch.optim.AdamW and lion_pytorch.Lion, with their scalars as device data on XLA.

Off XLA both are the libraries' optimizers, unchanged (the same numbers, bit for bit). On XLA the libraries build
Python-float scalars inside step() (1 - lr * wd, 1 - beta2, lr / (1 - beta1^t), ...), which torch_xla passes as
graph inputs but turns 0 and +-1 into constants and shares between equal values, and AdamW skips its decay when
the weight decay is 0: a trial whose values differ only in such a coincidence traces another graph and compiles it
again (AdamW's betas (0.9, 0.99) vs (0.9, 0.95): at t = 1 sqrt(1 - 0.99) rounds to the fp32 of 1 - 0.9). Here the
same updates take lr, weight decay, betas, eps and the bias corrections as the elements of one uploaded vector
per step (`device_scalars`, as Adam-atan2, SignSGD and the EMA do: trm/adam_atan2.py), so trials that differ
only in these values run the same compiled step (tests/xla/test_compile_cache.py). Tested against the libraries
on the CPU with the data path forced on (tests/test_schedules_optim.py) and on XLA (tests/xla/test_xla_optim.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import lion_pytorch
import torch
from lion_pytorch.lion_pytorch import update_fn as lion_update_fn
from torch import Tensor

from trm.adam_atan2 import device_scalars


def _as_data(forced: bool | None, p: Tensor) -> bool:
    return p.device.type == "xla" if forced is None else forced


class AdamW(torch.optim.AdamW):
    """torch.optim.AdamW. `scalars_as_data`: None (default) = on XLA parameters only; True forces the data path
    anywhere (the CPU tests of its numbers), False never takes it.

    Its XLA update is written here because torch's own way to take the scalars as tensors does not work on XLA
    (torch 2.9): foreach with capturable=True refuses XLA parameters, and the single-tensor capturable path hands a
    Tensor 1 - beta2 to addcmul_'s `value` (a number), which reads it back to the host every step
    (_local_scalar_dense: a sync and more graphs); the weight decay stays a float there, and 0 skips the decay.
    It is torch's single-tensor update without capturable (what the CPU runs), on the same state (torch's
    `_init_group`: `step` a CPU tensor, so reading it syncs nothing), for its options as trm.optim builds it:
    no amsgrad, maximize or differentiable (refused)."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        scalars_as_data: bool | None = None,
    ):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.scalars_as_data = scalars_as_data

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        params = [p for group in self.param_groups for p in group["params"]]
        if not params or not _as_data(self.scalars_as_data, params[0]):
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for option in ("amsgrad", "maximize", "differentiable", "foreach", "fused", "capturable"):
                if group[option]:
                    raise NotImplementedError(f"AdamW's scalars-as-data update has no {option}=True")
            params_with_grad: list[Tensor] = []
            grads: list[Tensor] = []
            exp_avgs: list[Tensor] = []
            exp_avg_sqs: list[Tensor] = []
            steps: list[Tensor] = []
            # torch's private helper, untyped: the same grouping AdamW.step does
            if self._init_group(group, params_with_grad, grads, exp_avgs, exp_avg_sqs, [], steps):  # type: ignore[no-untyped-call]
                raise NotImplementedError("AdamW's scalars-as-data update has no complex parameters")
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            beta1, beta2 = group["betas"]
            scalars: dict[float, tuple[Tensor, ...]] = {}  # per step count t (in practice one per group)
            for p, grad, exp_avg, exp_avg_sq, step_t in zip(params_with_grad, grads, exp_avgs, exp_avg_sqs, steps):
                step_t += 1  # noqa: PLW2901 (in place: the optimizer state's own step tensor)
                t = step_t.item()  # a CPU tensor, as in torch's non-capturable AdamW: no device sync
                if t not in scalars:  # each computed in double as torch's step computes it
                    scalars[t] = device_scalars(
                        p,
                        1 - lr * wd,
                        1 - beta1,
                        beta2,
                        1 - beta2,
                        (1 - beta2**t) ** 0.5,
                        eps,
                        lr / (1 - beta1**t),
                    )
                decay, weight1, decay2, weight2, correction2, epsilon, step_size = scalars[t]
                p.mul_(decay)  # torch skips it when weight_decay == 0: decay is then 1, the same numbers
                exp_avg.lerp_(grad, weight1)
                exp_avg_sq.mul_(decay2).addcmul_(grad, grad * weight2)  # addcmul_'s value takes no tensor
                denom = (exp_avg_sq.sqrt() / correction2).add_(epsilon)
                p.sub_(exp_avg.div(denom).mul_(step_size))  # addcdiv_'s value takes no tensor either
        return loss


class Lion(lion_pytorch.Lion):  # type: ignore[misc]  # lion_pytorch ships no types: its Lion is Any to mypy
    """lion_pytorch.Lion; `scalars_as_data` as AdamW's. The library's step, with its per-parameter update
    function (its hook: use_triton swaps in a Triton kernel the same way) replaced by one that runs the
    library's update off the data path and, on it, the same update written with tensor scalars: the library's
    takes them as `alpha=` (numbers only)."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        *,
        scalars_as_data: bool | None = None,
    ):
        super().__init__(params, lr=lr, betas=betas, weight_decay=weight_decay)
        self.scalars_as_data = scalars_as_data
        self.update_fn = self._update
        self._uploaded: dict[tuple[Any, ...], tuple[Tensor, ...]] = {}  # this step's scalars, per value set

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        try:
            return super().step(closure)
        finally:
            self._uploaded.clear()  # one upload per group and step, none kept past it

    def _update(
        self, p: Tensor, grad: Tensor, exp_avg: Tensor, lr: float, wd: float, beta1: float, beta2: float
    ) -> None:
        if not _as_data(self.scalars_as_data, p):
            lion_update_fn(p, grad, exp_avg, lr, wd, beta1, beta2)
            return
        key = (p.device, p.dtype, lr, wd, beta1, beta2)
        if key not in self._uploaded:
            self._uploaded[key] = device_scalars(p, 1 - lr * wd, beta1, 1 - beta1, beta2, 1 - beta2, lr)
        decay, decay1, weight1, decay2, weight2, step_size = self._uploaded[key]
        p.mul_(decay)
        update = exp_avg.mul(decay1).add_(grad * weight1).sign_()
        p.sub_(update.mul_(step_size))  # the update is -1/0/1: the product is exact, as alpha=-lr's
        exp_avg.mul_(decay2).add_(grad * weight2)
