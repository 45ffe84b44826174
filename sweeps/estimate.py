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


@dataclass(frozen=True)
class Packing:
    """The study on one division of the pod (launcher.slots): how many trials at once, and what it costs."""

    slots: str  # "pod", "vm", "chips:1", ...
    count: int  # slots: trials at once
    chips: int  # chips per trial
    per_chip_batch: float
    chip_hours: float
    wall_hours: float  # longest slot's queue (trials longest first onto the least-loaded slot)


def packings(
    costs: list[Cost], options: dict[str, tuple[int, int]], peak_flops: float, utilization: float
) -> list[Packing]:
    """Price the study (no trial pruned) on each division in `options` ({slots: (slot count, chips per slot)}).

    At one assumed utilization the chip-hours are the same for every division; what changes is the wall time (more
    trials at once) and the per-chip batch, which the utilization really depends on: a chip fed 24 examples a step
    runs far below one fed 192, so measure the utilization at your per-chip batch and set estimate.utilization."""
    out = []
    batch = costs[0].global_batch if costs else 0  # every trial of a study has the same global batch
    for name, (count, chips) in options.items():
        hours = sorted((c.hours(chips, peak_flops, utilization) for c in costs), reverse=True)
        queues = [0.0] * count
        for h in hours:
            queues[queues.index(min(queues))] += h
        out.append(Packing(name, count, chips, batch / chips, sum(hours) * chips, max(queues, default=0.0)))
    return out


def describe_packings(rows: list[Packing], utilization: float) -> list[str]:
    lines = [f"# packing (launcher.slots), every trial at {utilization:.0%} utilization; none pruned:"]
    for p in rows:
        lines.append(
            f"#   slots={p.slots:<8} {p.count:>3} at once x {p.chips:>2} chips, {p.per_chip_batch:g} examples/chip/step: "
            f"{p.chip_hours:.1f} chip-hours, wall {_hours(p.wall_hours)}"
        )
    return lines
