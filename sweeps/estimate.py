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

    def step_s(self, chips: int, peak_flops: float, utilization: float) -> float:
        return self.flops_per_sample_step * self.global_batch / (chips * peak_flops * utilization)

    def hours(self, chips: int, peak_flops: float, utilization: float) -> float:
        return self.step_s(chips, peak_flops, utilization) * self.steps / 3600


def trial_costs(trials: list[list[str]]) -> list[Cost]:
    """Params and FLOPs of each trial's model, with its batch and step count: one `trm.info --batch` process
    for all of them (torch is imported once; each count runs on the meta device, under a second)."""
    lines = "".join(json.dumps(list(overrides)) + "\n" for overrides in trials)
    out = subprocess.run([sys.executable, "-m", "trm.info", "--batch"], input=lines, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"trm.info failed for the trials' overrides: {out.stderr.strip()[-500:]}")
    infos: list[dict[str, Any]] = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return [Cost(i["params"], i["flops_per_sample_step"], i["global_batch_size"], i["train_steps"]) for i in infos]


def _hours(h: float) -> str:
    return f"{h:.1f} h" if h >= 1 else f"{h * 60:.0f} min"


def describe(cost: Cost, cfg: DictConfig) -> str:
    est, peak = cfg.estimate, cfg.estimate.peak_tflops * 1e12
    per_pod = ", ".join(
        f"{name} {cost.step_s(chips, peak, est.utilization) * 1e3:.0f} ms/step = {_hours(cost.hours(chips, peak, est.utilization))}"
        for name, chips in est.pods.items()
    )
    return (
        f"{cost.params / 1e6:.2f}M params, {cost.flops_per_sample_step / 1e9:.1f} GFLOP/sample-step, "
        f"batch {cost.global_batch} x {cost.steps} steps: {per_pod} "
        f"(at {est.utilization:.0%} of {est.peak_tflops:g} TFLOP/s per chip)"
    )


def describe_total(costs: list[Cost], cfg: DictConfig) -> str:
    """The whole study if no trial is pruned (an upper bound): what launching it commits to."""
    est, peak = cfg.estimate, cfg.estimate.peak_tflops * 1e12
    per_pod = ", ".join(
        f"{name} {_hours(sum(c.hours(chips, peak, est.utilization) for c in costs))}"
        for name, chips in est.pods.items()
    )
    return f"{len(costs)} trials, none pruned: {per_pod}"
