"""`python -m sweeps.utilization study=NAME [peak_tflops=275] [format=table|json] [storage.url=...]`

The fraction of the chips' peak a study's trials really reached, by per-chip batch: what `estimate.utilization`
should say before the dry run prices a pod division (sweeps/config/estimate.py). Every job measures its steady-state
step speed (trm/measures/throughput.py: after the first log point; evals, checkpoints and logging taken out) and stores
it in its trial's `details` (`throughput`); this reads the finished trials (complete or pruned) and prints, per
per-chip batch, the median over trials of flops_per_s / (devices x peak), and the override to paste:

    estimate.utilization={24:0.081,192:0.29}

Run a few short trials on each division first (e.g. `launcher.slots=pod` and `launcher.slots=vm`, a few hundred
steps each), then price the whole study with what they measured. `peak_tflops` defaults to the sweep config's
`estimate.peak_tflops` (a TPU v4 chip's bf16 peak); on another device give its own.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import asdict, dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from storage.cli import STORAGE_KEYS, ArgumentError, parse_args, run_cli, study_from_args
from storage.trial_record import TrialOutcome
from sweeps.config.compose import compose_sweep_config
from sweeps.config.config_values import SweepConfigError
from sweeps.config.estimate import UTILIZATION_KEY

FORMATS = ("table", "json")
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


def default_peak_tflops() -> float:
    """`estimate.peak_tflops` of conf/sweep.yaml: the one place the chip's peak is configured. Composed with its
    schema registered (sweeps.config.compose), as `python -m sweeps.run` composes it: a plain compose_config("sweep")
    failed with "Could not load 'sweep_schema'"; a config that does not compose is one ArgumentError line."""
    try:
        return float(compose_sweep_config([]).estimate.peak_tflops)
    except SweepConfigError as err:
        raise ArgumentError(
            f"peak_tflops: not given, and conf/sweep.yaml's estimate.peak_tflops unread: {err}"
        ) from None


@dataclass(frozen=True)
class Measured:
    """The trials of one per-chip batch on one kind of device."""

    examples_per_device: float
    device: str  # the trial's `device` attribute without its index (cpu, cuda, xla)
    precision: str | None
    trials: list[int]
    devices: int  # devices per trial (the most common, if they differ)
    samples_per_s: float  # medians over the trials
    tflops_per_device: float
    utilization: float
    utilization_range: tuple[float, float]


def measured(trials: list[FrozenTrial], peak_flops: float) -> list[Measured]:
    """The finished trials that carry a `throughput`, grouped by (per-chip batch, device kind, precision)."""
    groups: dict[tuple[float, str, str | None], list[tuple[int, dict[str, Any]]]] = {}
    for trial in trials:
        record = TrialOutcome.of(trial.user_attrs)
        speed = record.throughput
        if trial.state not in FINISHED or not isinstance(speed, dict) or not speed.get("flops_per_s"):
            continue
        device = str(record.device or "unknown").split(":")[0]
        key = (float(speed["examples_per_device"]), device, record.precision)
        groups.setdefault(key, []).append((trial.number, speed))
    rows = []
    for (batch, device, precision), members in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        speeds = [s for _, s in members]
        per_device = [s["flops_per_s"] / s["devices"] for s in speeds]
        fractions = [f / peak_flops for f in per_device]
        rows.append(
            Measured(
                examples_per_device=batch,
                device=device,
                precision=precision,
                trials=[n for n, _ in members],
                devices=statistics.mode(int(s["devices"]) for s in speeds),
                samples_per_s=statistics.median(float(s["samples_per_s"]) for s in speeds),
                tflops_per_device=statistics.median(per_device) / 1e12,
                utilization=statistics.median(fractions),
                utilization_range=(min(fractions), max(fractions)),
            )
        )
    return rows


def override(rows: list[Measured]) -> str:
    """`estimate.utilization={batch:fraction,...}` for the rows of one device kind (3 significant digits)."""
    points = ",".join(f"{r.examples_per_device:g}:{r.utilization:.3g}" for r in rows)
    return f"{UTILIZATION_KEY}={{{points}}}"


def render_table(study: str, rows: list[Measured], peak_tflops: float) -> str:
    lines = [f"study {study}: steady-state step speed of finished trials, against {peak_tflops:g} TFLOP/s per device"]
    if not rows:
        lines.append(
            "  no finished trial has a measured throughput (trials shorter than two log points, or written by a "
            "version before trm/measures/throughput.py)"
        )
        return "\n".join(lines)
    lines.append(
        f"  {'device':<7} {'precision':<14} {'examples/device':>15} {'devices':>7} {'trials':>6} "
        f"{'samples/s':>10} {'TFLOP/s/device':>14} {'utilization':>11}  range"
    )
    for r in rows:
        low, high = r.utilization_range
        lines.append(
            f"  {r.device:<7} {r.precision or '?':<14} {r.examples_per_device:>15g} {r.devices:>7} {len(r.trials):>6} "
            f"{r.samples_per_s:>10.3g} {r.tflops_per_device:>14.4g} {r.utilization:>11.2%}  {low:.2%}-{high:.2%}"
        )
    for device in dict.fromkeys(r.device for r in rows):
        lines.append(f"  {device}: {override([r for r in rows if r.device == device])}")
    return "\n".join(lines)


def utilization(argv: list[str]) -> int:
    args = parse_args(
        argv, {"study": None, "peak_tflops": None, "format": "table", **STORAGE_KEYS}, (__doc__ or "").strip()
    )
    if args["format"] not in FORMATS:
        raise ArgumentError(f"format={args['format']!r}: expected one of {list(FORMATS)}")
    if "peak_tflops" in args:
        try:
            peak_tflops = float(args["peak_tflops"])
        except ValueError:
            raise ArgumentError(f"peak_tflops={args['peak_tflops']!r}: expected the device's peak in TFLOP/s") from None
        if not peak_tflops > 0:
            raise ArgumentError(f"peak_tflops={args['peak_tflops']!r}: expected the device's peak in TFLOP/s, > 0")
    study = study_from_args(args)  # a missing study is one line before anything is composed
    if "peak_tflops" not in args:
        peak_tflops = default_peak_tflops()
    rows = measured(study.get_trials(deepcopy=False), peak_tflops * 1e12)
    if args["format"] == "json":
        print(json.dumps({"study": args["study"], "peak_tflops": peak_tflops, "rows": [asdict(r) for r in rows]}))
    else:
        print(render_table(args["study"], rows, peak_tflops))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(utilization, argv)


if __name__ == "__main__":
    sys.exit(main())
