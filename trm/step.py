"""The hot path: one training step, the evaluation, and the precision they run in.

Both take plain values (the precision, the loss kind, the clip norm, the divisor), never the run's config: the
loop reads its config once, and benchmarks and the XLA lane call the same step with their own numbers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

from trm.losses import METRIC_KEYS, act_loss, normalize_metrics
from trm.model import ACTModel, Carry
from trm.runtime.base import Runtime

# The concrete train.precision -> (autocast dtype or None, dtype of the carry and so of the residual stream).
# `auto` (the config's default) is not one of them: the trainer resolves it once per job (trm/precision.py).
# "bf16": matmuls in bf16, the carry and residual sums in fp32 (autocast's own choice; our default for bf16).
# "bf16_reference": the TRM reference's forward_dtype=bfloat16: the carry and every activation in bf16, RMSNorm
# and RoPE computed in fp32 inside; the loss in fp32 either way (the reference uses float64, docs/fidelity.md).
PRECISIONS: dict[str, tuple[torch.dtype | None, torch.dtype]] = {
    "fp32": (None, torch.float32),
    "bf16": (torch.bfloat16, torch.float32),
    "bf16_reference": (torch.bfloat16, torch.bfloat16),
}


def _precision(precision: str) -> tuple[torch.dtype | None, torch.dtype]:
    if precision == "auto":
        raise ValueError(
            "train.precision='auto' reached the step unresolved: resolve it first "
            f"(trm.precision.resolve_precision) to one of {list(PRECISIONS)}"
        )
    if precision not in PRECISIONS:
        raise ValueError(f"train.precision={precision!r}: expected one of {list(PRECISIONS)}")
    return PRECISIONS[precision]


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    compute_dtype, _ = _precision(precision)
    return contextlib.nullcontext() if compute_dtype is None else torch.autocast(device.type, dtype=compute_dtype)


def carry_dtype(precision: str) -> torch.dtype:
    return _precision(precision)[1]


def train_step(
    model: nn.Module,
    carry: Carry,
    batch: dict[str, Tensor],
    exploration: Tensor,
    cycles: tuple[int, int],
    optimizers: list[torch.optim.Optimizer],
    *,
    precision: str,
    loss: str,
    grad_clip: float,
    loss_divisor: int,
) -> tuple[Carry, Tensor]:
    """One supervision step on every slot of the carry. Returns the new carry and the metric sums.

    `precision` and `loss` are train.precision and train.loss, `grad_clip` the max grad norm (0: off),
    `loss_divisor` what the summed loss is divided by (Runtime.loss_divisor)."""
    with autocast(precision, carry.y.device):
        carry, logits, q_halt = model(carry, batch, exploration, *cycles)
    total, metrics = act_loss(logits, q_halt, carry.labels, carry.inputs, carry.halted, carry.steps, loss)
    (total / loss_divisor).backward()  # DDP averages over ranks; XLA SPMD sees the global batch
    if grad_clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    for opt in optimizers:
        opt.step()
        opt.zero_grad(set_to_none=True)
    return carry, metrics


@torch.no_grad()
def evaluate(
    model: ACTModel,
    batches: Iterable[dict[str, Tensor]],
    runtime: Runtime,
    cycles: tuple[int, int],
    *,
    precision: str,
    loss: str,
) -> dict[str, float]:
    """Run every eval example through all halting steps; metrics summed over all ranks."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(len(METRIC_KEYS), device=runtime.device)
    for host_batch in batches:
        batch = runtime.to_device(host_batch)
        carry = model.initial_carry(batch, carry_dtype(precision))
        for _ in range(model.cfg.halt_max_steps):
            with autocast(precision, carry.y.device):
                carry, logits, q_halt = model(carry, batch, 0.0, *cycles)
        _, metrics = act_loss(
            logits, q_halt, carry.labels, carry.inputs, carry.halted, carry.steps, loss, valid=batch["valid"]
        )
        sums += metrics
        runtime.step_boundary()  # one bounded graph per eval batch on XLA
    model.train(was_training)
    return normalize_metrics(runtime.all_reduce_sum(sums).tolist(), "eval")
