"""The real-study check on TRM-Bench-long (issue 54, item 5): the space the study searches, so that every trial it
draws has a curve in the table, and its answer and cost judged against the table and the pod replays.

The space: the sub-grid of model_scaling's tiny space that every seed of the long table holds whole
(bench/trm_bench/pod.py seed_tables, the one the replays run on); while no seed holds one yet, the sub-grid that
the table's configurations (table_specs.LONG) will hold whole once recorded: either way arch.mixer cut to mlp_t.
sweeps.run is given it as one Hydra override that merges into the study's mapping
(`study.space.tiny={arch.mixer:'choice(mlp_t)'}`): the other keys keep the study's own ranges.

The judgment: with the seeds' tables whole on that sub-grid, by the seed-mean truth (bench/trm_bench/table.py
seed_truth, as the pod replays are judged); before, by the study's seed's own table within one eval SE, on the
configurations it holds so far. The replays beside it: bench/results/trm_bench_pod_long_seed<S>.json's row of the
strategy at W = the study's max_concurrent, if that file was replayed at the study's n_trials.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from optuna.distributions import CategoricalDistribution

from bench._results import RESULTS
from bench.trm_bench.pod import grid_cost_s, measured_startup_s, seed_tables, with_steady_seconds
from bench.trm_bench.replay import study_conf
from bench.trm_bench.subgrid import cut, subgrid_space
from bench.trm_bench.table import Table, config, load, seed_truth
from bench.trm_bench.table_specs import LONG
from sweeps.search.space import SearchSpace

PODS = RESULTS / "trm_bench_pod_long_seed{seed}.json"
POD_KEYS = ("near_best_at_end", "paid_at_end_median", "used_at_end_median", "found", "reps")


def space(path: Path = LONG.out) -> tuple[SearchSpace, str]:
    """The space a long check study searches, and where it came from."""
    try:
        return seed_tables(path)[1], "the sub-grid every seed of the table holds whole"
    except (FileNotFoundError, ValueError):
        planned = {config(c) for c in LONG.configurations or ()}
        return subgrid_space(study_conf()[0], planned), "the sub-grid the table's configurations hold once recorded"


def space_overrides(cut_space: SearchSpace, scale: str = "tiny") -> list[str]:
    """The sweeps.run override that gives model_scaling's `scale` space the cut keys' choices (a Hydra dict merges
    into the study's mapping: keys not named keep the study's ranges); none when nothing is cut."""
    full = study_conf()[0]
    cut_keys = {k: d for k, d in cut_space.params.items() if d != full.params[k]}
    if not cut_keys:
        return []
    items = []
    for key, dist in cut_keys.items():
        if not isinstance(dist, CategoricalDistribution):
            raise ValueError(f"{key}: only a choice is cut to a sub-grid (bench/trm_bench/subgrid.py), got {dist}")
        items.append(f"{key}:'choice({', '.join(map(str, dist.choices))})'")
    return [f"study.space.{scale}={{{','.join(items)}}}"]


def judge(path: Path, seed: int, best: dict[str, Any] | None) -> dict[str, Any]:
    """The study's best configuration judged by the seed mean where every seed holds the sub-grid whole, else by
    the seed's own (partial) table within one eval SE; and the grid the compute is a share of (None: not whole)."""
    try:
        tables, _ = seed_tables(path)
    except (FileNotFoundError, ValueError):
        tables = []
    own = next((t for t in tables if t.seed == seed), None)
    c = None if best is None else config(best)
    if own is not None and len(tables) >= 2:
        truth = seed_truth(tables)
        return {
            "judged_by": f"the mean over seeds {list(truth.seeds)} (one seed-inclusive SE)",
            "truth": truth.summary(),
            "best_in_table": own.curves[c].value if c in own.curves else None,
            "best_mean": truth.means.get(c) if c is not None else None,
            "target": truth.target,
            "found": None if c not in truth.means else truth.near_best(c),
            **grid_of(own, tables),
        }
    partial = _own_table(path, seed)
    in_table = partial.curves[c].value if partial is not None and c in partial.curves else None
    return {
        "judged_by": "the seed's own table (one eval SE), on the configurations it holds so far",
        "curves": 0 if partial is None else len(partial.curves),
        "best_in_table": in_table,
        "best_mean": None,
        "target": None if partial is None else partial.target,
        "found": None if in_table is None or partial is None else in_table >= partial.target - 1e-12,
        "grid_gflops": None,
        "grid_s": None,
    }


def _own_table(path: Path, seed: int) -> Table | None:
    """The seed's curves on the study's space, however few (None: none yet)."""
    try:
        return cut(load(path, seed), space(path)[0])
    except (FileNotFoundError, ValueError):
        return None


def grid_of(own: Table, tables: Sequence[Table]) -> dict[str, Any]:
    """The unpruned sub-grid's FLOPs and seconds (as the pod replays count them: each trial's start-up, its evals at
    the configuration's steady pace over the seeds)."""
    return {
        "grid_gflops": own.grid_gflops,
        "grid_s": grid_cost_s(with_steady_seconds(own, tables), measured_startup_s()),
    }


def pod_row(seed: int, strategy: str, workers: int, n_trials: int, pods: Path | None = None) -> dict[str, Any]:
    """The pod replays' row of `strategy` at `workers` trials at once, if replayed at `n_trials`; else why not."""
    pods = pods or PODS.with_name(PODS.name.format(seed=seed))
    if not pods.exists():
        return {"row": None, "note": "no replays yet"}
    saved = json.loads(pods.read_text())
    row = next((r for r in saved["rows"] if r["strategy"] == strategy and r["workers"] == workers), None)
    if row is None or saved["n_trials"] != n_trials:
        have = sorted({(r["strategy"], r["workers"]) for r in saved["rows"]})
        return {"row": None, "note": f"no replays of {strategy} at W={workers} and n_trials={n_trials} "
                f"({pods.name}: n_trials={saved['n_trials']}, rows {have})"}  # fmt: skip
    return {"row": {k: row[k] for k in POD_KEYS}, "note": None}


def markdown(seed: int, r: dict[str, Any]) -> str:
    """The long check's sentence: cost, answer and judgment, then the replays' row or why there is none."""

    def pct(x: float | None) -> str:
        return "unknown (the sub-grid is not recorded whole)" if x is None else f"{100 * x:.1f}%"

    params = " ".join(f"{k.split('.')[-1]}={v}" for k, v in r["best_params"].items())
    verdict = {True: "found", False: "not found", None: "not judged yet (no curve of it in the table)"}[r["found"]]
    mean = "" if r["best_mean"] is None else f", mean over seeds {r['best_mean']:.4f}"
    in_table = "" if r["best_in_table"] is None else f", in the table {r['best_in_table']:.4f}"
    target = "" if r["target"] is None else f" against target {r['target']:.4f}"
    row = r["replays"]["row"]
    replays = (
        r["replays"]["note"]
        if row is None
        else f"Its pod replays at W={r['workers']}, {r['n_trials']} trials: near-best in "
        f"{100 * row['near_best_at_end']:.0f}% of studies, paid {100 * row['paid_at_end_median']:.1f}%, used "
        f"{100 * row['used_at_end_median']:.1f}% (medians)"
    )
    return (
        f"A real study of {r['strategy']} on TRM-Bench-long seed {seed}'s trials, {r['n_trials']} trials "
        f"({r['trials']['complete']} complete of {r['trials']['settled']} settled), {r['workers']} at once: compute "
        f"{pct(r['compute_share'])} of the unpruned sub-grid's FLOPs, paid {pct(r['paid_share_s'])} and used "
        f"{pct(r['used_share_s'])} of its seconds; best {params}, measured {r['best_measured']:.4f}{in_table}{mean}"
        f"{target}, judged by {r['judged_by']}: {verdict}. {replays[0].upper()}{replays[1:]}."
    )
