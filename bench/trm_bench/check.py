"""The replays checked against reality (issues 42 and 54): one real study of model_scaling's default strategy, not
a replay, on a TRM-Bench table's trial settings and one training seed; its compute and its answer beside the
replays' distribution for the same strategy and n_trials, and its record (every trial's params, state, value,
steps, seconds and FLOPs) in the result, so that the committed result is the study's export.

    python -m bench.trm_bench.check run --seed 1 --n-trials 24        # a real study: tens of minutes on 2 cores
    python -m bench.trm_bench.check report --seed 1 --n-trials 24     # -> bench/results/trm_bench_check_seed1.*
    python -m bench.trm_bench.check run --table long --seed 1         # 2,000 steps: hours (docs/benchmarks.md)
    python -m bench.trm_bench.check report --table long --seed 1      # -> bench/results/trm_bench_check_long_seed1.*

`run` is `python -m sweeps.run study=model_scaling` with the study's own sampler and pruner (whatever conf/ ships),
the table's trial overrides (bench/trm_bench/table_specs.py, TINY's or LONG's) and `seed=S` in every trial, on its
own SQLite file under the table's state directory; the same command resumes it. Its trials run as the default
runs them (max_concurrent from the laptop site); the tiny replays run one trial at a time, which is one of the
things checked. The long table holds part of the space: its study searches the sub-grid the table holds whole and
runs no confirm stage (bench/trm_bench/check_long.py).

`report` reads the study back: its compute is every trial's training FLOPs (a pruned trial's up to its verdict)
as a share of the unpruned grid's on that seed's table; its answer is its best trial's configuration, judged by
that configuration's value in the table (tiny: within one eval SE of the table's best, as a replay is judged;
long: within one seed-inclusive SE of the best seed mean, as the pod replays are), and by the value the study
itself measured. The long one stands beside the pod replays (bench/trm_bench/pod.py) at the study's W and n_trials.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
from omegaconf import OmegaConf
from optuna.trial import FrozenTrial, TrialState

from bench._results import RESULTS, ROOT, run_header, write_results
from bench._sweep import hydra_list
from bench.trm_bench import check_long
from bench.trm_bench.pod import SHIPPED_N_TRIALS
from bench.trm_bench.table import config, load
from bench.trm_bench.table_specs import LONG, OUT, TABLES
from bench.trm_bench.table_specs import storage_url as table_storage_url
from storage import open_storage
from storage.study_record import StudyAttrs
from storage.trial_record import TrialOutcome
from sweeps.search.space import params_to_values
from sweeps.status import trial_row

REPLAYS = RESULTS / "trm_bench_replay_seed{seed}.json"
N_TRIALS = {"tiny": 24, "long": SHIPPED_N_TRIALS}  # the long one: the pod replays' (the shipped site's) n_trials


def shipped_strategy() -> str:
    """model_scaling's sampler/pruner/metric as the replays name it: the committed choice's, which conf/ ships
    (tests/test_trm_bench.py ties the two), so the check follows the default when the choice moves."""
    from bench.trm_bench import choice as trm_bench_choice

    return trm_bench_choice.choose({s: trm_bench_choice.load_rows(s) for s in trm_bench_choice.CHOICE_SEEDS}).strategy


def study_name(seed: int, table: str = "tiny") -> str:
    return f"trm_bench_check_seed{seed}" if table == "tiny" else f"trm_bench_check_{table}_seed{seed}"


def storage_url(state: Path, seed: int) -> str:
    return table_storage_url(state, seed).replace(f"seed{seed}.db", f"check_seed{seed}.db")


def site_max_concurrent() -> int:
    """The trials a study of the default site runs at once (the check's runs take it unchanged)."""
    return int(OmegaConf.load(ROOT / "conf" / "site" / "laptop.yaml").max_concurrent)


def run_command(
    state: Path, seed: int, n_trials: int, table: str = "tiny", trial_extra: Sequence[str] = ()
) -> list[str]:
    """The sweeps.run overrides of the check: the study's defaults, the table's trials (and for the long table, the
    space cut to the sub-grid it holds: bench/trm_bench/check_long.py). `trial_extra`: more trial overrides (a
    smoke test's short trials)."""
    state = state.resolve()
    trial = [*TABLES[table].trial, f"seed={seed}", f"data.root={state / 'data'}", *trial_extra]
    # The long check's study: no confirm stage (the table's seed mean judges its answer; the replays count none).
    space = [] if table == "tiny" else [*check_long.space_overrides(check_long.space()[0]), "confirm.at_end=false"]
    return [
        "study=model_scaling",
        f"n_trials={n_trials}",
        f"study.name={study_name(seed, table)}",
        f"storage.url={storage_url(state, seed)}",
        f"output_root={state / 'check_runs'}",
        "reeval.at_end=false",  # the table has no re-evaluation: the answer is judged by the table's values
        "wandb.enabled=false",
        f"hydra.run.dir={state / 'hydra' / study_name(seed, table)}",
        *space,
        "trial.overrides=" + hydra_list(trial),
        *TABLES[table].run,  # the long table's longer stall timeout: its deepest trials log minutes apart
    ]


def run(
    state: Path,
    seed: int,
    n_trials: int,
    table: str = "tiny",
    trial_extra: Sequence[str] = (),
    extra: Sequence[str] = (),
) -> int:
    """The real study, resumed when run again (`trial_extra`, `extra`: more trial and sweeps.run overrides)."""
    state.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "sweeps.run", *run_command(state, seed, n_trials, table, trial_extra), *extra]
    print("$ " + " ".join(cmd[1:]), flush=True)
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    with open(state / f"check_seed{seed}.log", "a") as log:
        return subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env).returncode


def record(trials: Sequence[FrozenTrial]) -> list[dict[str, Any]]:
    """The study's export, one row per trial number: its params, state, value, steps (the last it reported and the
    last it trained), seconds and training FLOPs (a pruned trial's up to its verdict)."""
    return [
        {**trial_row(t), "last_step": t.last_step, "compute_flops": TrialOutcome.of(t.user_attrs).compute_flops}
        for t in trials
    ]


def report(
    state: Path,
    seed: int,
    n_trials: int,
    table_path: Path | None = None,
    replays: Path | None = None,
    strategy: str | None = None,
    table: str = "tiny",
    workers: int | None = None,
) -> dict[str, Any]:
    """The real study's compute and answer against the table, and the replays' at the same n_trials (of
    `strategy`, default: the one model_scaling ships), with the study's record. `replays`: the tiny table's
    sequential replays, the long one's pod replays (at `workers` trials at once, default: the site's)."""
    strategy = strategy or shipped_strategy()
    study = optuna.load_study(study_name=study_name(seed, table), storage=open_storage(storage_url(state, seed)))
    trials = study.get_trials(deepcopy=False)
    settled = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    complete = [t for t in settled if t.state == TrialState.COMPLETE]
    if not complete:
        raise ValueError(f"study {study.study_name}: no complete trial yet ({len(trials)} trials)")
    best = max(complete, key=lambda t: float(t.value or 0.0))
    best_params = params_to_values(best.params)
    common = {
        "table": table,
        "strategy": strategy,
        "n_trials": n_trials,
        "trials": {"complete": len(complete), "settled": len(settled)},
        "best_params": best_params,
        "best_measured": best.value,
        "definition": StudyAttrs.of(study.user_attrs).definition,
        "record": record(trials),
    }
    flops = sum(float(TrialOutcome.of(t.user_attrs).compute_flops or 0.0) for t in settled)
    if table == "long":
        judged = check_long.judge(table_path or LONG.out, seed, best_params)
        return {**common, **long_report(settled, judged, flops, seed, n_trials, replays, strategy, workers)}
    on_table = load(table_path or OUT, seed)
    in_table = on_table.curves[config(best_params)].value
    replays = replays or REPLAYS.with_name(REPLAYS.name.format(seed=seed))
    rows = json.loads(replays.read_text())["rows"] if replays.exists() else []
    row = next((r for r in rows if r["strategy"] == strategy), None)
    return {
        **common,
        "compute_share": flops / 1e9 / on_table.grid_gflops,
        "best_in_table": in_table,
        "table_best": on_table.best,
        "table_target": on_table.target,
        "found": in_table >= on_table.target - 1e-12,
        "replays_found": None if row is None else row["found_with_n_trials"].get(str(n_trials)),
        "replays_compute_median": None if row is None else row["compute_with_n_trials_median"].get(str(n_trials)),
    }


def long_report(
    settled: Sequence[FrozenTrial],
    judged: dict[str, Any],
    flops: float,
    seed: int,
    n_trials: int,
    pods: Path | None,
    strategy: str,
    workers: int | None,
) -> dict[str, Any]:
    """The long study's answer as check_long.judge judged it, its cost as shares of the sub-grid's FLOPs and (as
    the pod replays count it: wall x W paid, the trials' own seconds used) seconds, and the pod replays' row at
    the same W and n_trials."""
    workers = workers or site_max_concurrent()
    used_s = sum((t.datetime_complete - t.datetime_start).total_seconds() for t in settled if t.datetime_complete and t.datetime_start)  # fmt: skip
    starts = [t.datetime_start for t in settled if t.datetime_start]
    ends = [t.datetime_complete for t in settled if t.datetime_complete]
    wall_s = (max(ends) - min(starts)).total_seconds() if starts and ends else 0.0
    grid_gflops, grid_s = judged.pop("grid_gflops"), judged.pop("grid_s")
    return {
        "workers": workers,
        **judged,
        "compute_share": None if grid_gflops is None else flops / 1e9 / grid_gflops,
        "used_share_s": None if grid_s is None else used_s / grid_s,
        "paid_share_s": None if grid_s is None else wall_s * workers / grid_s,
        "wall_s": wall_s,
        "replays": check_long.pod_row(seed, strategy, workers, n_trials, pods),
    }


def markdown(seed: int, r: dict[str, Any]) -> str:
    if r.get("table") == "long":
        return check_long.markdown(seed, r)
    params = " ".join(f"{k.split('.')[-1]}={v}" for k, v in r["best_params"].items())
    replays = (
        "no replays of it on this seed yet"
        if r["replays_found"] is None
        else f"its replays at {r['n_trials']} trials: a near-best configuration in {100 * r['replays_found']:.0f}% "
        f"of studies, median compute {100 * r['replays_compute_median']:.1f}%"
    )
    return (
        f"A real study of {r['strategy']} (model_scaling's defaults as it ran) on seed {seed}'s trials, {r['n_trials']} trials "
        f"({r['trials']['complete']} complete): compute {100 * r['compute_share']:.1f}% of the unpruned grid's; best "
        f"{params}, measured {r['best_measured']:.4f}, in the table {r['best_in_table']:.4f} against the table's best "
        f"{r['table_best']:.4f} (target {r['table_target']:.4f}): {'found' if r['found'] else 'not found'}. "
        f"{replays}."
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("run", "report"))
    p.add_argument("--table", choices=sorted(TABLES), default="tiny", help="whose trials, space and replays")
    p.add_argument("--seed", type=int, default=1, help="the training seed: the held-out one (of either table)")
    p.add_argument("--n-trials", type=int, default=None, help="default: tiny 24, long the shipped site's")
    p.add_argument("--state", type=Path, default=None, help="default: the table's state directory")
    p.add_argument(
        "--strategy", default=None, help="the study's sampler/pruner/metric, as the replays name it (default: shipped)"
    )
    args = p.parse_args(argv)
    state = args.state or TABLES[args.table].default_state
    n_trials = args.n_trials or N_TRIALS[args.table]
    if args.what == "run":
        return run(state, args.seed, n_trials, args.table)
    result = report(state, args.seed, n_trials, strategy=args.strategy, table=args.table)
    header = run_header("trm_bench_check", sys.argv[1:] if argv is None else argv)
    text = markdown(args.seed, result)
    write_results(study_name(args.seed, args.table), {**header, **result}, text)  # the study's name is the file's
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
