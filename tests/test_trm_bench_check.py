"""bench/trm_bench/check.py: a real study of the shipped strategy beside the replays, on TRM-Bench-tiny and -long.

The report tests read studies built here on synthetic tables (tests/test_trm_bench.py synthetic_table); the smoke
test runs the real platform on two short trials and reads the study back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest

from bench.trm_bench import check as trm_bench_check
from bench.trm_bench import check_long
from bench.trm_bench.subgrid import grid
from bench.trm_bench.table import Table, config, load
from bench.trm_bench.table_specs import LONG
from storage.trial_record import TrialOutcome
from sweeps.config.compose import compose_sweep_config
from sweeps.search.space import parse_space
from tests.test_trm_bench import KEYS, synthetic_table

CHOICES = dict(zip(KEYS, ((32, 64), (1, 2), (1, 2, 3), (1, 2, 3), ("attention", "mlp_t"))))


def add_trials(study: optuna.Study, table: Table, runs: list[tuple[tuple[Any, ...], int, float | None]]) -> float:
    """Each (configuration, steps, value) as a settled trial that spent the table's FLOPs to `steps` (value None:
    pruned there, having reported its evals); the GFLOPs they spent in all."""
    spent = 0.0
    for values, steps, value in runs:
        params = dict(zip(KEYS, values))
        points = [p for p in table.curves[config(params)].points if p.step <= steps]
        spent += points[-1].gflops
        study.add_trial(
            optuna.trial.create_trial(
                params=params,
                distributions={k: optuna.distributions.CategoricalDistribution(CHOICES[k]) for k in params},
                value=value,
                state=optuna.trial.TrialState.PRUNED if value is None else optuna.trial.TrialState.COMPLETE,
                intermediate_values={p.step: p.blank for p in points},
                user_attrs=TrialOutcome(compute_flops=points[-1].gflops * 1e9, steps=steps).as_attrs(),
            )
        )
    return spent


def test_the_real_study_check_judges_its_answer_by_the_table_and_counts_pruned_compute(tmp_path: Path) -> None:
    """A study's compute is every settled trial's training FLOPs (a pruned one's up to its verdict) as a share of
    the grid's; its answer is its best trial's configuration, judged by the table's value of it; the replays' row of
    the same strategy and n_trials stands beside it; the result holds the study's record, trial by trial."""
    table_path = tmp_path / "table.json"
    synthetic_table(table_path)
    table = load(table_path, 0)
    study = optuna.create_study(
        study_name=trm_bench_check.study_name(0),
        storage=trm_bench_check.storage_url(tmp_path, 0),
        direction="maximize",
    )
    best = (64, 2, 3, 3, "mlp_t")  # the synthetic table's best
    spent = add_trials(study, table, [((32, 1, 1, 1, "mlp_t"), 500, 0.3), (best, 500, 0.9), ((64, 1, 1, 1, "attention"), 250, None)])  # fmt: skip
    study.enqueue_trial(dict(zip(KEYS, best)))  # waiting: not settled, not counted
    replays = tmp_path / "replays.json"
    row = {
        "strategy": trm_bench_check.shipped_strategy(),
        "found_with_n_trials": {"3": 0.5},
        "compute_with_n_trials_median": {"3": 0.2},
    }
    replays.write_text(json.dumps({"rows": [row]}))
    r = trm_bench_check.report(tmp_path, 0, 3, table_path, replays)
    assert r["trials"] == {"complete": 2, "settled": 3}
    assert r["compute_share"] == pytest.approx(spent / table.grid_gflops)
    assert r["best_params"] == dict(zip(KEYS, best)) and r["found"] and r["best_in_table"] == table.best
    assert (r["replays_found"], r["replays_compute_median"]) == (0.5, 0.2)
    assert "found" in trm_bench_check.markdown(0, r) and "50% of studies" in trm_bench_check.markdown(0, r)
    pruned = r["record"][2]
    assert [t["state"] for t in r["record"]] == ["COMPLETE", "COMPLETE", "PRUNED", "WAITING"]
    assert (pruned["number"], pruned["last_step"], pruned["steps"], pruned["value"]) == (2, 250, 250, None)
    assert pruned["params"]["arch.mixer"] == "attention" and pruned["compute_flops"] > 0


def test_the_long_check_runs_the_long_tables_trials_on_the_sub_grid_it_holds() -> None:
    """`run --table long`: LONG's trial settings, and a space (as sweeps.run composes it) whose every configuration
    the long table records (the MLP-t sub-grid, cut by a Hydra override that keeps the study's other ranges)."""
    cmd = trm_bench_check.run_command(Path("/state"), 1, 40, "long")
    trial = next(o for o in cmd if o.startswith("trial.overrides="))
    assert all(f"'{o}'" in trial for o in LONG.trial) and "'seed=1'" in trial
    assert "study.name=trm_bench_check_long_seed1" in cmd and "stall_timeout_s=1800" in cmd
    sweep = compose_sweep_config([o for o in cmd if not o.startswith("hydra.")])
    space = parse_space(sweep.study.space.tiny, sweep.study.conditional.tiny)
    drawn = {config(c) for c in grid(space)}
    assert len(drawn) == 36 and drawn <= {config(c) for c in LONG.configurations or ()}
    tiny = trm_bench_check.run_command(Path("/state"), 1, 24)
    assert not any(o.startswith("study.space") for o in tiny) and "'train.steps=500'" in tiny[-1]


def long_table(path: Path) -> Table:
    """A long-like table: seeds 0 and 1 with the MLP-t sub-grid whole and one attention curve; seed 1's values a
    little lower, so the seed mean differs from either seed."""
    rows = json.loads(json.dumps(synthetic_table(path)["seeds"]["0"]))
    kept = [r for r in rows if r["params"]["arch.mixer"] == "mlp_t"] + [rows[0]]
    lower = json.loads(json.dumps(kept))
    for r in lower:
        for p in r["curve"]:
            p["exact"] = round(p["exact"] * 0.98, 4)
    path.write_text(json.dumps({"benchmark": "trm_bench_long", "seeds": {"0": kept, "1": lower}}))
    return load(path, 1)


def test_the_long_check_is_judged_by_the_seed_mean_beside_the_pod_replays_at_its_w(tmp_path: Path) -> None:
    table_path = tmp_path / "long.json"
    table = long_table(table_path)
    study = optuna.create_study(
        study_name=trm_bench_check.study_name(1, "long"),
        storage=trm_bench_check.storage_url(tmp_path, 1),
        direction="maximize",
    )
    best = (64, 2, 3, 2, "mlp_t")  # next to the best, 64/2/3/3: within one seed-inclusive SE, or not
    value = table.curves[config(dict(zip(KEYS, best)))].value
    spent = add_trials(study, table, [((32, 1, 1, 1, "mlp_t"), 2000, 0.2), (best, 500, value), ((64, 1, 2, 1, "mlp_t"), 250, None)])  # fmt: skip
    strategy = trm_bench_check.shipped_strategy()
    pods = tmp_path / "pods.json"
    rows = [{"strategy": strategy, "workers": w, "near_best_at_end": 0.9 + w / 100, "paid_at_end_median": 0.3,
             "used_at_end_median": 0.25, "found": 1.0, "reps": 100} for w in (1, 2, 8)]  # fmt: skip
    pods.write_text(json.dumps({"n_trials": 3, "rows": rows}))
    r = trm_bench_check.report(tmp_path, 1, 3, table_path, pods, table="long", workers=2)
    assert "mean over seeds [0, 1]" in r["judged_by"] and r["truth"]["seeds"] == [0, 1]
    mean = (value + load(table_path, 0).curves[config(dict(zip(KEYS, best)))].value) / 2
    assert r["best_mean"] == pytest.approx(mean, abs=1e-3)
    assert r["found"] is False and r["best_mean"] < r["truth"]["target"] < r["truth"]["best"]  # 64/2/3/3's
    mlp = [c for c in table.curves.values() if c.params["arch.mixer"] == "mlp_t"]
    assert r["compute_share"] == pytest.approx(spent / sum(c.gflops for c in mlp))  # the sub-grid's, no attention
    assert r["replays"]["row"]["near_best_at_end"] == 0.92 and r["workers"] == 2
    assert len(r["record"]) == 3 and r["record"][1]["last_step"] == 500
    assert "near-best in 92% of studies" in trm_bench_check.markdown(1, r)
    assert check_long.pod_row(1, strategy, 32, 3, pods)["note"].startswith(f"no replays of {strategy} at W=32")
    assert check_long.pod_row(1, strategy, 2, 3, tmp_path / "none.json")["note"] == "no replays yet"


def test_a_long_table_without_a_whole_sub_grid_runs_on_the_one_it_will_hold(tmp_path: Path) -> None:
    """Before any seed holds the MLP-t sub-grid whole, the long check still runs on it (LONG's configurations),
    and its answer is judged on the seed's own curves so far, with no grid to take a share of."""
    path = tmp_path / "partial.json"
    rows = [r for r in synthetic_table(path)["seeds"]["0"] if r["params"]["arch.mixer"] == "mlp_t"][:5]
    path.write_text(json.dumps({"seeds": {"0": rows, "1": rows}}))
    space, source = check_long.space(path)
    assert "once recorded" in source and set(space.params["arch.mixer"].choices) == {"mlp_t"}  # type: ignore[attr-defined]
    assert check_long.space_overrides(space) == ["study.space.tiny={arch.mixer:'choice(mlp_t)'}"]
    judged = check_long.judge(path, 1, rows[0]["params"])
    assert judged["curves"] == 5 and judged["grid_gflops"] is None and judged["best_mean"] is None
    assert check_long.judge(path, 1, rows[0]["params"] | {"arch.hidden_size": 99})["found"] is None


@pytest.mark.slow
def test_a_real_tiny_check_study_reads_back_into_its_report(tmp_path: Path) -> None:
    """`run` starts sweeps.run with the check's overrides (here: 2 trials of 4 steps, no confirm stage); `report`
    reads the study it stored, with each trial's params, state, value, steps and FLOPs."""
    smoke = ["train.steps=4", "train.eval_interval=2", "train.log_interval=2", "train.eval_examples=8"]
    smoke += ["data.num_train=64", "data.num_test=16"]
    state = tmp_path / "state"
    rc = trm_bench_check.run(state, 1, 2, trial_extra=smoke, extra=["confirm.at_end=false"])
    assert rc == 0, (state / "check_seed1.log").read_text()[-3000:]
    table_path = tmp_path / "table.json"
    table_path.write_text(json.dumps({"seeds": {"1": synthetic_table(table_path)["seeds"]["0"]}}))
    r = trm_bench_check.report(state, 1, 2, table_path, tmp_path / "no_replays.json")
    assert r["trials"]["settled"] == 2 and len(r["record"]) == 2
    for row in r["record"]:
        assert row["state"] in ("COMPLETE", "PRUNED") and set(row["params"]) == set(KEYS)
        assert row["last_step"] in (2, 4) and row["steps"] in (2, 4) and row["compute_flops"] > 0
    assert r["definition"] and r["replays_found"] is None
