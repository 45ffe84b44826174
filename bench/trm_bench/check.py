"""The replays checked against reality (issue 42): one real study of model_scaling's default strategy, not a
replay, on TRM-Bench-tiny's trial settings and one training seed; its compute and its answer beside the
replays' distribution for the same strategy and n_trials on that seed's curves.

    python -m bench.trm_bench.check run --seed 1 --n-trials 24        # a real study: tens of minutes on 2 cores
    python -m bench.trm_bench.check report --seed 1 --n-trials 24     # -> bench/results/trm_bench_check_seed1.*

`run` is `python -m sweeps.run study=model_scaling` with the study's own sampler and pruner (whatever conf/ ships),
the table's trial overrides (bench/trm_bench/table_specs.py TRIAL) and `seed=S` in every trial, on its own SQLite file
under the table's state directory; the same command resumes it. Its trials run as the default runs them
(max_concurrent from the laptop site); the replays run one trial at a time, which is one of the things checked.

`report` reads the study back: its compute is every trial's training FLOPs (a pruned trial's up to its verdict)
as a share of the unpruned grid's on that seed's table; its answer is its best trial's configuration, judged by
that configuration's value in the table (within one eval SE of the table's best, as a replay is judged), and by
the value the study itself measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from bench._results import RESULTS, ROOT, run_header, write_results
from bench._sweep import hydra_list
from bench.trm_bench.table import config, load
from bench.trm_bench.table_specs import DEFAULT_STATE, OUT, TRIAL
from bench.trm_bench.table_specs import storage_url as table_storage_url
from storage import open_storage
from storage.trial_record import TrialOutcome
from sweeps.search.space import params_to_values

REPLAYS = RESULTS / "trm_bench_replay_seed{seed}.json"


def shipped_strategy() -> str:
    """model_scaling's sampler/pruner/metric as the replays name it: the committed choice's, which conf/ ships
    (tests/test_trm_bench.py ties the two), so the check follows the default when the choice moves."""
    from bench.trm_bench import choice as trm_bench_choice

    return trm_bench_choice.choose({s: trm_bench_choice.load_rows(s) for s in trm_bench_choice.CHOICE_SEEDS}).strategy


def study_name(seed: int) -> str:
    return f"trm_bench_check_seed{seed}"


def storage_url(state: Path, seed: int) -> str:
    return table_storage_url(state, seed).replace(f"seed{seed}.db", f"check_seed{seed}.db")


def run_command(state: Path, seed: int, n_trials: int) -> list[str]:
    """The sweeps.run overrides of the check: the study's defaults, the table's trials."""
    state = state.resolve()
    trial = [*TRIAL, f"seed={seed}", f"data.root={state / 'data'}"]
    return [
        "study=model_scaling",
        f"n_trials={n_trials}",
        f"study.name={study_name(seed)}",
        f"storage.url={storage_url(state, seed)}",
        f"output_root={state / 'check_runs'}",
        "reeval.at_end=false",  # the table has no re-evaluation: the answer is judged by the table's values
        "wandb.enabled=false",
        f"hydra.run.dir={state / 'hydra' / study_name(seed)}",
        "trial.overrides=" + hydra_list(trial),
    ]


def run(state: Path, seed: int, n_trials: int) -> int:
    state.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "sweeps.run", *run_command(state, seed, n_trials)]
    print("$ " + " ".join(cmd[1:]), flush=True)
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    with open(state / f"check_seed{seed}.log", "a") as log:
        return subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env).returncode


def report(
    state: Path,
    seed: int,
    n_trials: int,
    table_path: Path = OUT,
    replays: Path | None = None,
    strategy: str | None = None,
) -> dict[str, Any]:
    """The real study's compute and answer against the table, and the replays' at the same n_trials (of
    `strategy`, default: the one model_scaling ships)."""
    strategy = strategy or shipped_strategy()
    table = load(table_path, seed)
    study = optuna.load_study(study_name=study_name(seed), storage=open_storage(storage_url(state, seed)))
    settled = [t for t in study.get_trials(deepcopy=False) if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    flops = sum(float(TrialOutcome.of(t.user_attrs).compute_flops or 0.0) for t in settled)
    best = max((t for t in settled if t.state == TrialState.COMPLETE), key=lambda t: float(t.value or 0.0))
    in_table = table.curves[config(params_to_values(best.params))].value
    replays = replays or REPLAYS.with_name(REPLAYS.name.format(seed=seed))
    rows = json.loads(replays.read_text())["rows"] if replays.exists() else []
    row = next((r for r in rows if r["strategy"] == strategy), None)
    return {
        "strategy": strategy,
        "n_trials": n_trials,
        "trials": {"complete": sum(t.state == TrialState.COMPLETE for t in settled), "settled": len(settled)},
        "compute_share": flops / 1e9 / table.grid_gflops,
        "best_params": params_to_values(best.params),
        "best_measured": best.value,
        "best_in_table": in_table,
        "table_best": table.best,
        "table_target": table.target,
        "found": in_table >= table.target - 1e-12,
        "replays_found": None if row is None else row["found_with_n_trials"].get(str(n_trials)),
        "replays_compute_median": None if row is None else row["compute_with_n_trials_median"].get(str(n_trials)),
    }


def markdown(seed: int, r: dict[str, Any]) -> str:
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
    p.add_argument("--seed", type=int, default=1, help="the training seed: the held-out one")
    p.add_argument("--n-trials", type=int, default=24)
    p.add_argument("--state", type=Path, default=DEFAULT_STATE)
    p.add_argument(
        "--strategy", default=None, help="the study's sampler/pruner/metric, as the replays name it (default: shipped)"
    )
    args = p.parse_args(argv)
    if args.what == "run":
        return run(args.state, args.seed, args.n_trials)
    result = report(args.state, args.seed, args.n_trials, strategy=args.strategy)
    header = run_header("trm_bench_check", sys.argv[1:] if argv is None else argv)
    text = markdown(args.seed, result)
    write_results(f"trm_bench_check_seed{args.seed}", {**header, **result}, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
