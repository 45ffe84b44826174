"""What a trial will cost on a TPU pod, before launching it (printed by `dry_run=true`).

FLOPs per sample-step come from `python -m trm.info <the trial's overrides>` (torch's FlopCounterMode on the
real model, in a subprocess: the driver never imports the model). Step time = FLOPs x global batch /
(chips x peak x utilization); the peak and the utilization are config (`estimate.*`), so the numbers are as
good as those two and say so. The utilization is one number, or one per per-chip batch (`{24: 0.08, 192: 0.3}`,
what `python -m sweeps.utilization` measures from a study's trials): a chip fed 24 examples a step runs far
below one fed 192, and that difference is what decides how to divide a pod (`launcher.slots`).
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from omegaconf import DictConfig, ListConfig, OmegaConf

from contracts.model_info import BATCH_FLAG, ModelInfo, request_lines
from sweeps.config.config_values import SweepConfigError, UserConfigError

UTILIZATION_KEY = "estimate.utilization"
UTILIZATION_ACCEPTED = (
    "a fraction of the peak in (0, 1], e.g. 0.3, or one per per-chip batch, e.g. {24: 0.08, 192: 0.3} "
    "(examples per chip per step: fraction); python -m sweeps.utilization study=NAME measures them"
)


class UtilizationError(UserConfigError):
    """`estimate.utilization` is not a fraction or a {per-chip batch: fraction} mapping."""


@dataclass(frozen=True)
class Utilization:
    """The fraction of the chips' peak a trial runs at, as a function of its per-chip batch.

    Between two measured batches it is interpolated linearly in log(batch) (utilization grows about that way
    until the chip is busy: on an H100 the MLP-t step did 23%, 68% and 96% of its batch-768 throughput at 24,
    96 and 384 examples); outside them it stays at the nearest measured value (no extrapolation)."""

    points: tuple[tuple[float, float], ...]  # (examples per chip, fraction), batches ascending

    @classmethod
    def parse(cls, value: object) -> Utilization:
        """From config: a number, or a mapping {examples per chip: fraction}. Errors name the key and the value."""
        raw = OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value
        if isinstance(raw, Mapping):
            items = list(raw.items())
        elif isinstance(raw, (int, float)) and not isinstance(raw, bool):
            items = [(1, raw)]
        else:
            raise UtilizationError(f"{UTILIZATION_KEY}={raw!r}: expected {UTILIZATION_ACCEPTED}")
        if not items:
            raise UtilizationError(f"{UTILIZATION_KEY}={raw!r} is empty: expected {UTILIZATION_ACCEPTED}")
        points = []
        for batch, fraction in items:
            try:
                b, f = float(batch), float(fraction)
            except (TypeError, ValueError):
                raise UtilizationError(
                    f"{UTILIZATION_KEY}: {batch!r}: {fraction!r} is not a number pair: expected {UTILIZATION_ACCEPTED}"
                ) from None
            if not (math.isfinite(b) and b > 0):
                raise UtilizationError(f"{UTILIZATION_KEY}: per-chip batch {batch!r} must be > 0")
            if isinstance(fraction, bool) or not (math.isfinite(f) and 0 < f <= 1):
                where = f" at per-chip batch {batch!r}" if isinstance(raw, Mapping) else ""
                raise UtilizationError(
                    f"{UTILIZATION_KEY}={fraction!r}{where}: a fraction of the peak must be in (0, 1]"
                )
            points.append((b, f))
        return cls(tuple(sorted(points)))

    @property
    def single(self) -> bool:
        return len(self.points) == 1

    def at(self, per_chip_batch: float) -> float:
        """The fraction at this many examples per chip per step."""
        pts = self.points
        if per_chip_batch <= pts[0][0]:
            return pts[0][1]
        for (b0, f0), (b1, f1) in zip(pts, pts[1:], strict=False):
            if per_chip_batch <= b1:
                t = math.log(per_chip_batch / b0) / math.log(b1 / b0)
                return f0 + t * (f1 - f0)
        return pts[-1][1]

    def describe(self) -> str:
        if self.single:
            return f"{self.points[0][1]:.0%}"
        return "by per-chip batch " + ", ".join(f"{b:g}: {f:.0%}" for b, f in self.points)


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
    out = subprocess.run(
        [sys.executable, "-m", "trm.info", BATCH_FLAG],
        check=False,
        input=request_lines(trials),
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:  # the model refuses a setting (arch.mixer=foo): its own line names the key
        last = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        raise SweepConfigError(f"trial.overrides: the model cannot be built from them: {last}")
    infos = [ModelInfo.parse(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return [Cost(i.params, i.flops_per_sample_step, i.global_batch_size, i.train_steps) for i in infos]


def _hours(h: float) -> str:
    return f"{h:.1f} h" if h >= 1 else f"{h * 60:.0f} min"


def describe(cost: Cost, pods: Mapping[str, int], peak_tflops: float, util: Utilization) -> str:
    """One trial's cost on each of `pods` (estimate.pods) at `peak_tflops` per chip and `util` (estimate.utilization,
    parsed once per dry run). The settings come one by one: sweeps/config/schema.py's Estimate block imports this module."""
    peak = peak_tflops * 1e12
    per_pod = []
    for name, chips in pods.items():
        fraction = util.at(cost.global_batch / chips)
        shown = "" if util.single else f" at {fraction:.0%}"
        step_ms = cost.step_s(chips, peak, fraction) * 1e3
        per_pod.append(f"{name} {step_ms:.0f} ms/step = {_hours(cost.hours(chips, peak, fraction))}{shown}")
    return (
        f"{cost.params / 1e6:.2f}M params, {cost.flops_per_sample_step / 1e9:.1f} GFLOP/sample-step, "
        f"batch {cost.global_batch} x {cost.steps} steps: {', '.join(per_pod)} "
        f"(utilization {util.describe()} of {peak_tflops:g} TFLOP/s per chip)"
    )


def describe_total(costs: list[Cost], pods: Mapping[str, int], peak_tflops: float, util: Utilization) -> str:
    """The whole study if no trial is pruned (an upper bound): what launching it commits to (arguments as in
    describe)."""
    return f"{len(costs)} trials, none pruned: {describe_hours(costs, pods, peak_tflops, util)}"


def describe_hours(costs: list[Cost], pods: Mapping[str, int], peak_tflops: float, util: Utilization) -> str:
    """The trainings' hours on each pod, one after another (`v4-8 1.2 h, v4-32 0.3 h`)."""
    peak = peak_tflops * 1e12
    return ", ".join(
        f"{name} {_hours(sum(c.hours(chips, peak, util.at(c.global_batch / chips)) for c in costs))}"
        for name, chips in pods.items()
    )


@dataclass(frozen=True)
class Packing:
    """The study on one division of the pod (launcher.slots): how many trials at once, and what it costs."""

    slots: str  # "pod", "vm", "chips:1", ...
    count: int  # slots: trials at once
    chips: int  # chips per trial
    per_chip_batch: float
    utilization: float  # the fraction of the peak assumed at that per-chip batch
    chip_hours: float
    wall_hours: float  # longest slot's queue (trials longest first onto the least-loaded slot)


def packings(
    costs: list[Cost], options: dict[str, tuple[int, int]], peak_flops: float, utilization: Utilization
) -> list[Packing]:
    """Price the study (no trial pruned) on each division in `options` ({slots: (slot count, chips per slot)}).

    Each division runs its trials at the utilization of its per-chip batch. With one number for every batch the
    chip-hours come out equal and only the wall time differs (more trials at once); with the utilization measured
    per batch (`sweeps.utilization`) the chip-hours show what a finer division saves."""
    out = []
    batch = costs[0].global_batch if costs else 0  # every trial of a study has the same global batch
    for name, (count, chips) in options.items():
        fraction = utilization.at(batch / chips) if batch else utilization.points[0][1]
        hours = sorted((c.hours(chips, peak_flops, fraction) for c in costs), reverse=True)
        queues = [0.0] * count
        for h in hours:
            queues[queues.index(min(queues))] += h
        out.append(Packing(name, count, chips, batch / chips, fraction, sum(hours) * chips, max(queues, default=0.0)))
    return out


def describe_packings(rows: list[Packing], utilization: Utilization) -> list[str]:
    lines = [f"# packing (launcher.slots), utilization {utilization.describe()}; none pruned:"]
    for p in rows:
        lines.append(
            f"#   slots={p.slots:<8} {p.count:>3} at once x {p.chips:>2} chips, {p.per_chip_batch:g} examples/chip/step"
            f" at {p.utilization:.0%}: {p.chip_hours:.1f} chip-hours, wall {_hours(p.wall_hours)}"
        )
    if utilization.single and len(rows) > 1:
        lines.append(
            "#   (one utilization for every per-chip batch: equal chip-hours by construction; measure yours per batch "
            "with python -m sweeps.utilization and set estimate.utilization={batch: fraction, ...})"
        )
    return lines
