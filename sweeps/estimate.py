"""What a trial will cost on a TPU pod, before launching it (printed by `dry_run=true`).

FLOPs per sample-step come from `python -m trm.info <the trial's overrides>` (torch's FlopCounterMode on the
real model, in a subprocess: the driver never imports the model). Step time = FLOPs x global batch /
(chips x peak x utilization); the peak and the utilization assumed are config (`estimate.*`), so the
numbers are as good as those two and say so.
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig


@dataclass
class Cost:
    params: int
    flops_per_sample_step: int
    global_batch: int
    steps: int

    def hours(self, chips: int, peak_flops: float, utilization: float) -> float:
        step_s = self.flops_per_sample_step * self.global_batch / (chips * peak_flops * utilization)
        return step_s * self.steps / 3600


def trial_cost(overrides: list[str]) -> Cost:
    """Params and FLOPs of the trial's model, with its batch and step count, from trm.info."""
    out = subprocess.run([sys.executable, "-m", "trm.info", *overrides], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"trm.info failed for {' '.join(overrides)}: {out.stderr.strip()[-500:]}")
    info: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return Cost(info["params"], info["flops_per_sample_step"], info["global_batch_size"], info["train_steps"])


def describe(cost: Cost, cfg: DictConfig) -> str:
    est = cfg.estimate
    per_pod = ", ".join(
        f"{name} {cost.hours(chips, est.peak_tflops * 1e12, est.utilization):.1f} h"
        for name, chips in est.pods.items()
    )
    return (
        f"{cost.params / 1e6:.2f}M params, {cost.flops_per_sample_step / 1e9:.1f} GFLOP/sample-step, "
        f"batch {cost.global_batch} x {cost.steps} steps: {per_pod} "
        f"(at {est.utilization:.0%} of {est.peak_tflops:g} TFLOP/s per chip)"
    )
