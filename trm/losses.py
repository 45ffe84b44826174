"""TRM loss (stablemax or softmax cross-entropy on the answer + 0.5 x Q-halt BCE) and its metrics.

Metrics are returned as *sums* over the batch (device tensors, no host sync); the trainer accumulates them
and normalizes at log points as the reference does (`normalize_metrics`; docs/fidelity.md, Metrics).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from contracts.metric_names import (  # torch-free, so the sweep driver can validate metric names
    HALTED_EXAMPLES,
)
from contracts.metric_names import METRIC_KEYS as METRIC_KEYS  # the sums' order, re-exported with the loss

IGNORE_INDEX = -100  # label of a cell the loss skips (torch cross_entropy's default ignore_index); on disk: PAD_LABEL
BLANK_TOKEN = 1
Q_HALT_LOSS_WEIGHT = 0.5


def log_stablemax(logits: Tensor, dim: int = -1) -> Tensor:
    """log of stablemax: s(x) = x + 1 for x >= 0, 1 / (1 - x) below; normalized like softmax.

    Computed in float32 (the reference uses float64, which TPUs and most CPUs run far slower)."""
    x = logits.float()
    s = torch.where(x >= 0, x + 1, 1 / (1 - x.clamp(max=0)))  # clamp keeps the unused branch finite
    return torch.log(s) - torch.log(s.sum(dim=dim, keepdim=True))


def token_cross_entropy(logits: Tensor, labels: Tensor, kind: str = "stablemax") -> Tensor:
    """Per-token loss [B, L]; 0 where the label is ignored."""
    valid = labels != IGNORE_INDEX
    safe_labels = torch.where(valid, labels, 0)
    if kind == "stablemax":
        logprobs = log_stablemax(logits)
    elif kind == "softmax":
        logprobs = F.log_softmax(logits.float(), dim=-1)
    else:
        raise ValueError(f"train.loss={kind!r}: expected 'stablemax' or 'softmax'")
    picked = logprobs.gather(-1, safe_labels.unsqueeze(-1)).squeeze(-1)
    return -torch.where(valid, picked, 0.0)


def act_loss(
    logits: Tensor,
    q_halt: Tensor,
    labels: Tensor,
    inputs: Tensor,
    halted: Tensor,
    steps: Tensor,
    kind: str = "stablemax",
    valid: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Return (summed loss to back-propagate, metric sums in METRIC_KEYS order).

    `valid` marks real rows of a padded eval batch; padded rows count nowhere."""
    if valid is None:
        valid = torch.ones_like(halted)
    mask = (labels != IGNORE_INDEX) & valid[:, None]
    cells = mask.sum(-1)
    divisor = cells.clamp_min(1).unsqueeze(-1)

    with torch.no_grad():
        correct = mask & (logits.argmax(-1) == labels)
        puzzle_solved = correct.sum(-1) == cells
        blank = mask & (inputs == BLANK_TOKEN)
        finished = halted & valid & (cells > 0)
        zero = torch.zeros((), device=logits.device)

    lm_loss = (token_cross_entropy(logits, labels, kind) / divisor).sum()
    q_halt_loss = (
        F.binary_cross_entropy_with_logits(q_halt, puzzle_solved.to(q_halt.dtype), reduction="none") * valid
    ).sum()
    loss = lm_loss + Q_HALT_LOSS_WEIGHT * q_halt_loss

    with torch.no_grad():
        metrics = torch.stack(
            [
                finished.sum(),
                torch.where(finished, correct.sum(-1) / divisor.squeeze(-1), zero).sum(),
                (finished & puzzle_solved).sum(),
                torch.where(finished, (correct & blank).sum(-1) / blank.sum(-1).clamp_min(1), zero).sum(),
                (finished & ((q_halt >= 0) == puzzle_solved)).sum(),
                torch.where(finished, steps, 0).sum(),
                valid.sum(),
                lm_loss.detach(),
                q_halt_loss.detach(),
            ]
        ).float()
    return loss, metrics


def normalize_metrics(sums: list[float], prefix: str) -> dict[str, float]:
    """Turn accumulated metric sums into means named `<prefix>/<metric>`, each meaning what the reference's
    metric of that name means: rates per halted example (`count`); train losses per example (the reference: per
    global batch), eval losses per halted example (its eval divides every metric by `count`). The count itself
    is logged as `halted_examples` (contracts/metric_names.py says why)."""
    values = dict(zip(METRIC_KEYS, sums))
    count = max(values["count"], 1.0)
    loss_divisor = count if prefix == "eval" else max(values["examples"], 1.0)
    out = {}
    for key, value in values.items():
        if key in ("count", "examples"):
            continue
        out[f"{prefix}/{key}"] = value / (loss_divisor if key.endswith("loss") else count)
    out[f"{prefix}/{HALTED_EXAMPLES}"] = values["count"]
    return out
