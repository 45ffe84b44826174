"""What the sweep costs on top of training: per trial, launch to first step and last step to tell, and the share
of a whole study's wall time spent outside training, for each launcher.

    python -m bench.sweep_overhead                          # local and torchrun, 10 trials each (~12 min here)
    python -m bench.sweep_overhead --launchers local --n-trials 5 --steps 40
    python -m bench.sweep_overhead --quick --out-dir /tmp/o # smoke run: 2 trials of 20 steps, local only
    python -m bench.sweep_overhead --launchers local,local+launcher.warm=true   # a fresh interpreter vs a warm worker

Each launcher runs a real study, `python -m sweeps.run study=<study> launcher=<name> pruner=none` (every
trial trains to its last step, W&B offline as a user's would) on its own SQLite file, without the study's end
stages (bench/_sweep.py NO_END_STAGES: they train, so the driver's shutdown would count them as overhead). The
phases come from the stamps the driver and the job store on each trial (bench/_sweep.py). Trials here train for
about half a minute; the overhead of a trial does not grow with its length (evals and checkpoints count as
training), so the share for 5-minute trials is projected from the measured per-trial overhead and the driver's
measured start-up and shutdown: outside / (outside + n x 300 s). Writes bench/results/sweep_overhead.json and .md.
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path
from typing import Any

from bench._results import RESULTS, fmt, run_header, write_results
from bench._sweep import (
    NO_END_STAGES,
    QUICK_TRIAL,
    hydra_list,
    load_trials,
    overhead_summary,
    projected_fraction,
    run_study,
    trial_record,
)

GOAL_FRACTION, PROJECTED_TRIAL_S = 0.02, 300.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--launchers",
        default="local,torchrun",
        help="comma list of launcher configs (conf/launcher/), each with optional +key=value overrides",
    )
    p.add_argument("--study", default="model_scaling")
    p.add_argument("--n-trials", type=int, default=10)
    p.add_argument("--steps", type=int, default=100, help="training steps per trial (tiny preset)")
    p.add_argument(
        "--out-dir",
        type=Path,
        default=RESULTS,
        help="results go here; the studies' files under <out-dir>/sweep_overhead/",
    )
    p.add_argument("--quick", action="store_true", help="2 trials of 20 steps, local launcher")
    p.add_argument("overrides", nargs="*", help="extra sweeps.run overrides for every launcher")
    args = p.parse_args(argv)
    args.work = args.out_dir / "sweep_overhead"
    if args.quick:
        args.n_trials, args.steps, args.launchers = 2, 20, "local"
    return args


def trial_overrides(args: argparse.Namespace) -> list[str]:
    """The laptop site's trial, shortened to --steps (one eval at the end, as a short trial would)."""
    if args.quick:
        return QUICK_TRIAL
    return [
        "experiment=tiny_cpu",
        f"train.steps={args.steps}",
        f"train.eval_interval={args.steps}",
        "train.log_interval=50",
        "train.eval_examples=128",
        "train.progress=false",
    ]


def run_launcher(launcher: str, args: argparse.Namespace) -> dict[str, Any]:
    config, *extra = launcher.split("+")
    label = re.sub(r"[^A-Za-z0-9]+", "_", launcher).strip("_")
    db = args.work / f"{label}.db"
    db.unlink(missing_ok=True)
    url, name = f"sqlite:///{db}", f"overhead_{label}"
    overrides = [
        f"study={args.study}", f"study.name={name}", f"launcher={config}", *extra, "pruner=none", f"n_trials={args.n_trials}",
        f"storage.url={url}", f"output_root={args.work / 'runs' / label}", f"hydra.run.dir={args.work / 'hydra' / label}",
        *NO_END_STAGES, f"trial.overrides={hydra_list(trial_overrides(args))}", *args.overrides,
    ]  # fmt: skip
    run = run_study(overrides, args.work / f"{label}.log")
    trials = load_trials(url, name)
    summary = overhead_summary(trials, run)
    summary["projected_fraction_5min"] = projected_fraction(summary, PROJECTED_TRIAL_S, args.n_trials)
    records = [trial_record(t) for t in trials]
    for r in records:
        r.pop("workdir", None)
    return {
        "launcher": launcher,
        **run,
        "states": sorted({t.state.name for t in trials}),
        "summary": summary,
        "trials": records,
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| launcher | trials | launch to first step s | (interpreter + imports) | (set-up in trm.train) | first step s | last step to tell s | outside training per trial s | study wall s | outside training | projected, 5-min trials |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["launchers"]:
        s, m = r["summary"], r["summary"]["median_s"]
        lines.append(
            f"| {r['launcher']} | {s['trials_timed']} | {m['launch_to_first_step']:.2f} | {m['launch_to_run']:.2f} | {m['run_to_first_step']:.2f} "
            f"| {m['first_step']:.2f} | {m['last_step_to_tell']:.2f} | {s['median_outside_per_trial_s']:.2f} | {s['study_wall_s']:.0f} "
            f"| {s['outside_fraction']:.1%} | {fmt(s['projected_fraction_5min'], '.2%')} |"
        )
    lines += ["", "Medians over the trials; last step to tell = " + " + ".join(("last_step_to_end", "end_to_exit_seen", "exit_seen_to_tell")) + ":", "",
              "| launcher | ask to launch | last step to job end (summary, W&B finish) | job end to exit seen (outcome write, exit, poll) | exit seen to tell | driver start to first ask | last tell to driver exit |",
              "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in result["launchers"]:
        s, m = r["summary"], r["summary"]["median_s"]
        lines.append(
            f"| {r['launcher']} | {m['ask_to_launch']:.3f} | {m['last_step_to_end']:.2f} | {m['end_to_exit_seen']:.2f} | {m['exit_seen_to_tell']:.3f} "
            f"| {s['driver_start_to_first_ask_s']:.2f} | {s['last_tell_to_driver_exit_s']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    shutil.rmtree(args.work / "runs", ignore_errors=True)
    args.work.mkdir(parents=True, exist_ok=True)
    launchers = [run_launcher(name.strip(), args) for name in args.launchers.split(",") if name.strip()]
    result = {
        **run_header("sweep_overhead", argv),
        "n_trials": args.n_trials,
        "steps": args.steps,
        "goal": {"max_outside_fraction": GOAL_FRACTION, "trial_training_s": PROJECTED_TRIAL_S},
        "launchers": launchers,
    }
    table = markdown(result)
    write_results("sweep_overhead", result, table, args.out_dir)
    return result


if __name__ == "__main__":
    main()
