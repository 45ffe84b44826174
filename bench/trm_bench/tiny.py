"""TRM-Bench-tiny: the whole learning curve of every configuration of `model_scaling`'s tiny space, per seed,
recorded once by the platform itself, so that any sampler x pruner can be replayed on it (bench/trm_bench/replay.py).
`--table long` records the longer table: 2,000 steps, evals every 100 steps on 512 puzzles, every MLP-t
configuration and 8 attention ones spread over width, layers and recursion depth (LONG in table_specs.py).

    python -m bench.trm_bench.tiny record                   # every seed, one after the other (hours: see below)
    python -m bench.trm_bench.tiny record --seeds 1 --jobs 2 --state /var/tmp/trm-bench
    python -m bench.trm_bench.tiny export                   # the studies -> bench/results/trm_bench_tiny.json
    python -m bench.trm_bench.tiny record --table long --seeds 0 --jobs 1   # one seed of the longer table
    python -m bench.trm_bench.tiny export --table long      # -> bench/results/trm_bench_long.json

`record` runs, per training seed S, one real study: `python -m sweeps.run study=model_scaling sampler=grid
pruner=none n_trials=<the space's size>` with the table's trial settings (table_specs.py) and `seed=S` in every trial, on its own
SQLite file under --state. A run that stops (Ctrl-C, a kill, the end of a session) is resumed by running the same
command: the driver continues the study, a job that was cut off resumes from its last checkpoint, and the grid
enumerates only what is not trained yet. --state defaults to a directory outside the work tree on purpose: a
fresh checkout of the repository finds the studies where the previous one left them. Where the state is gone
(a fresh machine), `record` carries the committed table's curves of that seed into the new state and trains only
the configurations it lacks, queued in a study of their own (carry_committed, either table); `export` puts the
two together.

A table that records a subset of the space (the longer one) queues its configurations in the study before the
first `sweeps.run`, in one fixed shuffled order shared by every seed, so that seeds recorded side by side hold the
same configurations at any moment and a partial table is spread over the space (the longer one's MLP-t sub-grid
first: table_specs.long_configurations says why).

`export` reads the studies back: per trial its parameters and, per eval, exact and blank accuracy, the cumulative
training FLOPs (trm.flops per sample step x batch x step) and the wall seconds since the job's first step (from
the `time` stamp of each metrics.jsonl record; a resumed job's time lost between its checkpoint and the cut is
not counted, only the steps it repeats). It writes one compact JSON file with the provenance (commit, command,
machine, settings) and only complete curves; it can run while `record` goes on.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import optuna
from optuna.trial import TrialState

from bench._results import ROOT, run_header
from bench._sweep import NO_END_STAGES, hydra_list
from bench.trm_bench.table_specs import STUDY, TABLES, TINY, Table, storage_url, study_name
from contracts.metrics_log import METRICS_FILE, WALL_TIME_KEY, read_metrics
from storage import open_storage
from storage.heartbeat import retry_history
from storage.trial_record import TrialLaunch, TrialOutcome
from sweeps.search.budget import budget_used
from sweeps.search.distinct_draws import as_config as config
from sweeps.search.space import params_to_values

EVAL_KEYS = ("eval/exact_accuracy", "eval/blank_accuracy")
TRAIN_KEY = "train/lm_loss"  # in every training log record, never in an eval record


def record_command(
    state: Path,
    seed: int,
    jobs: int,
    n_trials: int | None = None,
    extra: Sequence[str] = (),
    table: Table = TINY,
) -> list[str]:
    """The sweeps.run overrides that record (or resume) one seed's table; `n_trials` (default: the table's size)
    and `extra` trial overrides only for a smoke run (tests/test_trm_bench.py). Without the laptop site's
    re-evaluation and confirm stage: the table is the trials' curves, and a confirm stage at the recording's end
    would train its top configurations again (at TRM-Bench-long's 2,000 steps, hours) for records it never reads."""
    trial = [*table.trial, f"seed={seed}", f"data.root={state.resolve() / 'data'}", *extra]
    return [
        f"study={STUDY}",
        "sampler=grid",
        "pruner=none",
        f"n_trials={table.size if n_trials is None else n_trials}",
        "seed=1",  # the grid's order (the sampler seed); the training seed is in the trials' overrides
        f"study.name={study_name(seed, table)}",
        f"storage.url={storage_url(state, seed)}",
        f"output_root={state.resolve() / 'runs'}",
        f"max_concurrent={jobs}",
        *NO_END_STAGES,
        "wandb.enabled=false",
        f"hydra.run.dir={state.resolve() / 'hydra' / f'seed{seed}'}",
        *table.run,
        "trial.overrides=" + hydra_list(trial),
    ]


def queue_configurations(state: Path, seed: int, table: Table) -> bool:
    """Create seed `seed`'s study of a table that records a subset of the space, with its configurations queued in
    the table's order (the baseline is queued only into an empty study, so it keeps its place). True if created."""
    if table.configurations is None or (state / f"seed{seed}.db").exists():
        return False
    state.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(
        study_name=study_name(seed, table), storage=open_storage(storage_url(state, seed)), direction="maximize"
    )
    for params in table.configurations:
        study.enqueue_trial(dict(params))
    return True


def git_commit() -> str | None:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or None


def carried_path(state: Path, seed: int) -> Path:
    return state / f"carried_seed{seed}.json"


def carry_committed(state: Path, seed: int, table: Table = TINY, committed: Path | None = None) -> int | None:
    """Where seed `seed` has no study under `state` but the committed table (`committed`, default the table's own
    results file) has curves of it: keep those curves (carried_seed<S>.json, with the sessions that recorded them
    in provenance.jsonl), create the study and queue every configuration the table lacks, in the table's order.
    Returns the n_trials that trains exactly those; None: nothing carried. A table without a fixed list (the tiny
    grid) spans the product of the values the carried rows take per key (checked against the table's size)."""
    committed = table.out if committed is None else committed
    if (state / f"seed{seed}.db").exists() or carried_path(state, seed).exists() or not committed.exists():
        return None
    saved = json.loads(committed.read_text())
    rows = saved["seeds"].get(str(seed), [])
    if not rows:
        return None
    if table.configurations is not None:
        space = [dict(c) for c in table.configurations]
    else:
        keys = sorted(rows[0]["params"])
        values = [sorted({r["params"][k] for r in rows}, key=str) for k in keys]
        space = [dict(zip(keys, combo)) for combo in itertools.product(*values)]
        if len(space) != table.size:
            raise ValueError(
                f"{committed}: seed {seed}'s rows span {len(space)} configurations, not the space's {table.size}"
            )
    have = {config(r["params"]) for r in rows}
    missing = [c for c in space if config(c) not in have]
    state.mkdir(parents=True, exist_ok=True)
    with open(state / "provenance.jsonl", "a") as f:
        for session in saved.get("recording_sessions", []):
            f.write(json.dumps(session) + "\n")
    study = optuna.create_study(
        study_name=study_name(seed, table), storage=open_storage(storage_url(state, seed)), direction="maximize"
    )
    for params in missing:
        study.enqueue_trial(params)
    carried_path(state, seed).write_text(json.dumps(rows, separators=(",", ":")) + "\n")
    print(f"seed {seed}: {len(rows)} curves carried from {committed}; {len(missing)} configurations queued", flush=True)
    return len(missing)


def rerun_failed(state: Path, seed: int, configurations: int, table: Table = TINY) -> int:
    """The n_trials that trains every configuration still missing from seed `seed`'s study: a configuration whose
    every trial failed for good is queued again (the grid counts a failed configuration as tried, and its final
    failure counts against n_trials), and the budget is what the study used plus what is missing."""
    if not (state / f"seed{seed}.db").exists():
        return configurations
    study = optuna.load_study(study_name=study_name(seed, table), storage=open_storage(storage_url(state, seed)))
    trials = study.get_trials(deepcopy=False)
    done = {config(t.params) for t in trials if t.state == TrialState.COMPLETE}
    # A queued trial holds its parameters as Optuna's fixed_params until it is asked (a driver's retry: in params).
    pending = {
        config(t.params or t.system_attrs.get("fixed_params", {}))
        for t in trials
        if t.state in (TrialState.WAITING, TrialState.RUNNING)
    }
    for params in {config(t.params) for t in trials if t.state == TrialState.FAIL and t.params} - done - pending:
        study.enqueue_trial(dict(params))
        print(f"seed {seed}: queued again, every trial of it failed: {dict(params)}", flush=True)
    return budget_used(trials) + configurations - len(done)


def record(
    state: Path,
    seeds: list[int],
    jobs: int,
    argv: list[str],
    n_trials: int | None = None,
    extra: Sequence[str] = (),
    table: Table = TINY,
) -> int:
    """Run (or resume) each seed's study; every call appends its provenance to <state>/provenance.jsonl."""
    state.mkdir(parents=True, exist_ok=True)
    size = table.size if n_trials is None else n_trials
    session = {**run_header("trm_bench_tiny", argv), "benchmark": table.name, "commit": git_commit()}
    session |= {"seeds": seeds, "jobs": jobs}
    with open(state / "provenance.jsonl", "a") as f:
        f.write(json.dumps(session) + "\n")
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    for seed in seeds:
        if size == table.size and not extra:  # the table's own recording (not a smoke run): a lost state
            carry_committed(state, seed, table)  # carries the committed curves and queues the rest
        queue_configurations(state, seed, table)
        carried = json.loads(carried_path(state, seed).read_text()) if carried_path(state, seed).exists() else []
        budget = rerun_failed(state, seed, size - len(carried), table)
        if budget == 0:  # every configuration carried: sweeps.run refuses n_trials=0, and there is nothing to train
            print(f"seed {seed}: complete, nothing to train", flush=True)
            continue
        cmd = [sys.executable, "-m", "sweeps.run", *record_command(state, seed, jobs, budget, extra, table)]
        print("$ " + " ".join(cmd[1:]), flush=True)
        with open(state / f"seed{seed}.log", "a") as log:
            code = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
        if code != 0:
            print(f"seed {seed}: sweeps.run exited {code}; its log: {state / f'seed{seed}.log'}", file=sys.stderr)
            return code
    return 0


def eval_interval(attrs: dict[str, Any]) -> int:
    """The trial's train.eval_interval, from the training overrides the driver stored (the last one wins)."""
    overrides = TrialLaunch.of(attrs).train_overrides or []
    values = [o.split("=", 1)[1] for o in overrides if o.startswith("train.eval_interval=")]
    if not values:
        raise ValueError(f"trial overrides {overrides}: no train.eval_interval (the recorder always sets one)")
    return int(values[-1])


def curve(
    run_dirs: Sequence[Path], flops_per_step: int, steps: int, every: int, start: float | None
) -> list[dict[str, Any]] | None:
    """Per eval: step, the eval metrics, cumulative FLOPs, wall seconds since `start` (the job's first step; None:
    its first log point) and, where the step also logged training, the eval's own seconds (the job writes the
    training record, then evaluates, then writes the eval record), from the run directories of a retry chain,
    first first (a retry resumes from its chain's checkpoint in a run directory of its own; a repeated step: the
    later record wins). None unless every eval `every` steps up to `steps` is there."""
    records = [r for d in run_dirs if (d / METRICS_FILE).exists() for r in read_metrics(d)]
    evals = {int(r["step"]): r for r in records if all(k in r for k in EVAL_KEYS)}
    logged = {int(r["step"]): r[WALL_TIME_KEY] for r in records if TRAIN_KEY in r and WALL_TIME_KEY in r}
    if sorted(evals) != list(range(every, steps + 1, every)):
        return None
    first = start if start is not None else min(r[WALL_TIME_KEY] for r in records if WALL_TIME_KEY in r)
    return [
        {
            "step": step,
            "exact": round(float(r["eval/exact_accuracy"]), 6),
            "blank": round(float(r["eval/blank_accuracy"]), 6),
            "gflops": round(flops_per_step * step / 1e9, 3),
            "wall_s": round(r[WALL_TIME_KEY] - first, 2),
            **({"eval_s": round(r[WALL_TIME_KEY] - logged[step], 2)} if step in logged else {}),
        }
        for step, r in sorted(evals.items())
    ]


def export(state: Path, seeds: list[int], committed: Path | None = None, table: Table = TINY) -> dict[str, Any]:
    """The table of `seeds` from the studies under `state`. A seed this state never recorded keeps the rows of the
    `committed` table, and its recording sessions stay: exporting seed 2's state on a fresh machine wrote seeds 0
    and 1 as empty."""
    saved = json.loads(committed.read_text()) if committed is not None and committed.exists() else {}
    tables: dict[str, list[dict[str, Any]]] = {}
    for seed in seeds:
        url = storage_url(state, seed)
        if not (state / f"seed{seed}.db").exists():
            tables[str(seed)] = saved.get("seeds", {}).get(str(seed), [])
            continue
        study = optuna.load_study(study_name=study_name(seed, table), storage=open_storage(url))
        trials = study.get_trials(deepcopy=False)
        rows = []
        for t in trials:
            if t.state != TrialState.COMPLETE:
                continue
            attrs, outcome = t.user_attrs, TrialOutcome.of(t.user_attrs)
            steps = int(cast(int, outcome.steps))  # a COMPLETE trial's job stored both
            per_step = int(cast(float, outcome.compute_flops)) // steps  # FLOPs per sample-step x the global batch
            chain = [trials[n] for n in retry_history(t)] + [t]
            workdirs = [TrialLaunch.of(c.user_attrs).workdir for c in chain]
            run_dirs = [Path(w) / "run" for w in workdirs if w is not None]
            timing = TrialOutcome.of(chain[0].user_attrs).timing or {}
            points = curve(run_dirs, per_step, steps, eval_interval(attrs), timing.get("first_step_start"))
            if points is None:
                continue
            rows.append(
                {
                    "params": params_to_values(t.params),
                    # a retry resumed the run: its wall seconds include the time between the cut and the resume
                    "resumed": len(chain) > 1,
                    "params_count": outcome.params_count,
                    "finished_at": round(t.datetime_complete.timestamp()) if t.datetime_complete else None,
                    "curve": points,
                }
            )
        if carried_path(state, seed).exists():  # curves an earlier state recorded (carry_committed)
            trained = {config(r["params"]) for r in rows}
            carried = json.loads(carried_path(state, seed).read_text())
            rows += [r for r in carried if config(r["params"]) not in trained]
        # A committed curve this state has not recorded (yet) stays: a state started anew on a fresh machine for a
        # table that is not carried (the long one) must not drop what an earlier state recorded.
        trained = {config(r["params"]) for r in rows}
        rows += [r for r in saved.get("seeds", {}).get(str(seed), []) if config(r["params"]) not in trained]
        rows.sort(key=lambda r: sorted(r["params"].items()))
        tables[str(seed)] = rows
    provenance = state / "provenance.jsonl"
    lines = [json.dumps(s) for s in saved.get("recording_sessions", [])]
    lines += provenance.read_text().splitlines() if provenance.exists() else []
    sessions = list({line: json.loads(line) for line in lines}.values())  # a carried session once
    return {
        "benchmark": table.name,
        "command": "python -m bench.trm_bench.tiny record"
        + ("" if table is TINY else " --table long")
        + " --seeds "
        + ",".join(map(str, seeds)),
        "recording_sessions": sessions,  # each `record` call: its commit, machine and start (a row's finished_at
        # falls in one of them)
        "sweeps_run": record_command(Path("<state>"), 0, 2, table=table),
        "space_size": table.size,
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seeds": tables,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("record", "export"))
    p.add_argument("--table", choices=tuple(TABLES), default="tiny", help="tiny: 500 steps; long: 2,000 steps")
    p.add_argument("--seeds", default=None, help="training seeds, comma-separated (default: the table's)")
    p.add_argument("--state", type=Path, default=None, help="the studies' SQLite files and runs")
    p.add_argument("--jobs", type=int, default=2, help="trials at once (each with OMP_NUM_THREADS=1 by default)")
    p.add_argument("--out", type=Path, default=None, help="the exported table (default: bench/results/<table>.json)")
    p.add_argument("--n-trials", type=int, default=None, help="fewer only for a smoke run")
    p.add_argument("--trial-override", action="append", default=[], help="appended to every trial (smoke runs)")
    args = p.parse_args(argv)
    table = TABLES[args.table]
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else list(table.seeds)
    state = args.state or table.default_state
    out = args.out or table.out
    if args.what == "record":
        argv_used = sys.argv[1:] if argv is None else argv
        return record(state, seeds, args.jobs, argv_used, args.n_trials, args.trial_override, table)
    exported = export(state, seeds, out, table)
    out.write_text(json.dumps(exported, separators=(",", ":")) + "\n")
    counts = {s: len(rows) for s, rows in exported["seeds"].items()}
    print(f"{out}: complete curves per seed {counts} of {table.size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
