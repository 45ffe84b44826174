"""bench/trm_bench/horizon.py: the same replay at every horizon, read from the tables the project commits."""

from __future__ import annotations

import json

import pytest

from bench.trm_bench import horizon, rule_choice
from bench.trm_bench.table import Curve, Point, Table, config, seed_truth
from bench.trm_bench.truths import EVAL_ONLY, truncated, truths


def test_the_thousand_step_studies_read_as_one_table_of_distinct_configurations() -> None:
    table = horizon.study_table()
    saved = json.loads(horizon.THOUSAND.read_text())
    trained = {
        config(t["params"])
        for s in saved["per_seed"]
        for t in s["arms"][0]["trials"]
        if t["state"] == "COMPLETE" and t["eval"]
    }
    assert set(table.curves) == trained and table.steps == 1000 and table.eval_examples == 256
    # FLOPs grow with the step and end at what the trial recorded
    some = next(t for s in saved["per_seed"] for t in s["arms"][0]["trials"] if t["state"] == "COMPLETE")
    curve = table.curves[config(some["params"])]
    assert curve.gflops == pytest.approx(some["compute_flops"] / 1e9)
    assert [p.gflops for p in curve.points] == sorted(p.gflops for p in curve.points)


def synthetic(late_best: bool) -> Table:
    """Ten configurations; one starts worst and ends best (the deep one), when `late_best`."""
    curves = {}
    for i in range(10):
        late = late_best and i == 9
        points = tuple(
            Point(
                step,
                exact=(0.9 if late and step == 400 else 0.5),
                blank=(0.1 if late else 0.5) + step / 1e4,
                gflops=float(step),
                wall_s=0.0,
            )
            for step in (100, 200, 300, 400)
        )
        curves[config({"arch.hidden_size": i})] = Curve({"arch.hidden_size": i}, points)
    return Table(0, curves, 256)


def test_a_rule_is_judged_on_the_same_orders_and_the_unpruned_study_always_holds_the_best() -> None:
    table = synthetic(late_best=True)
    for seed in range(5):
        unpruned = horizon.replay(table, "none", seed, None)
        assert unpruned.holds[-1] and unpruned.pruned == 0
        assert unpruned.gflops[-1] == pytest.approx(table.grid_gflops)
    # median from 50%: the late starter is below the median at step 200 and is cut wherever it comes after the
    # 3 startup trials (the others tie, and a tie is not below the median); a study that cut it never holds the best
    cut = [horizon.replay(table, "median_late", seed, None) for seed in range(20)]
    assert all(r.pruned == (0 if r.holds[-1] else 1) for r in cut)
    assert 0 < sum(r.pruned for r in cut) < 20
    row = horizon.summarize("synthetic", table, "median_late", cut)
    assert row["n_trials"] == 10 and 0 < row["near_best_at_end"] < 1 and row["paid_at_end_median"] < 1


def test_an_unknown_table_name_is_refused_with_the_names_there_are(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        horizon.main(["--tables", "tiny:9", "--reps", "1"])
    err = capsys.readouterr().err
    assert "--tables tiny:9: no such table" in err and "tiny:0" in err and "1000" in err


def test_a_long_seed_joins_only_with_enough_curves() -> None:
    named = horizon.tables(long_min=10**6)
    assert not any(name.startswith("long:") for name in named)
    assert {"tiny:0", "tiny:1", "tiny:2", "1000"} <= set(named)


def row(table: str, rule: str, found: float, paid: float, configurations: int = 72) -> dict[str, object]:
    return {
        "table": table,
        "rule": rule,
        "near_best_at_n_trials": found,
        "paid_at_n_trials_median": paid,
        "configurations": configurations,
    }


def test_the_rule_is_chosen_by_its_worst_table_within_the_budget_and_judged_on_the_held_out_one() -> None:
    tables = [("tiny:0", 72), ("tiny:1", 72), ("1000", 27)]
    rows = []
    for name, n in tables:
        rows.append(row(name, "none", 1.0, 0.57, n))  # finds always, over the budget on the 72-configuration tables
        rows.append(row(name, "median_40", 1.0, 0.2, n))  # the best, but no conf/pruner file: never chosen
        rows.append(row(name, "median_late", 0.95 if name != "1000" else 0.4, 0.35, n))  # lost at 1,000 steps
        # 0.80 everywhere; pays 0.9 of the 27-configuration table: no budget there (n_trials covers the grid)
        rows.append(row(name, "headroom", 0.8, 0.38 if n == 72 else 0.9, n))
    choice = rule_choice.choose_rule(rows)
    assert choice.rule == "headroom" and choice.worst_near_best == 0.8 and choice.worst_paid == 0.38
    assert choice.budget_tables == ("tiny:0", "tiny:1")  # the 27-configuration table is no budget table
    assert choice.within_budget and choice.provisional and choice.held_out_holds is None
    held = rule_choice.choose_rule([*rows, row(rule_choice.HELD_OUT, "headroom", 0.91, 0.39, 44)])
    assert held.held_out_holds is True and held.held_out_whole and rule_choice.HELD_OUT not in held.tables
    partial = rule_choice.choose_rule([*rows, row(rule_choice.HELD_OUT, "headroom", 0.91, 0.39, 14)])
    assert partial.held_out_holds is True and not partial.held_out_whole
    short = rule_choice.choose_rule([*rows, row(rule_choice.HELD_OUT, "headroom", 0.89, 0.39, 44)])
    assert short.held_out_holds is False


def test_with_no_rule_within_the_budget_the_best_worst_case_is_chosen_and_said() -> None:
    rows = [row("tiny:0", "none", 1.0, 0.57), row("tiny:0", "median_late", 0.7, 0.45)]
    choice = rule_choice.choose_rule(rows)
    assert choice.rule == "none" and not choice.within_budget
    with pytest.raises(ValueError, match="no selectable rule"):
        rule_choice.choose_rule([row("tiny:0", "median_40", 1.0, 0.1)])
    # Only tables n_trials covers (a partial long table): no pay is judged, which the choice says, not "0% paid".
    small = rule_choice.choose_rule([row("long:0", "median_late", 0.7, 0.68, 18)])
    assert small.budget_tables == () and small.worst_paid == 0.0 and small.within_budget


def test_the_figure_draws_each_rule_per_table_with_the_goal_and_the_budget() -> None:
    from bench.trm_bench.horizon_figure import REGRET_FLOOR, figure

    table = synthetic(late_best=True)
    rows = [
        horizon.summarize(name, table, rule, [horizon.replay(table, rule, s, None) for s in range(6)])
        for name in ("a", "b")
        for rule in ("none", "median_late")
    ]
    curves = rows[0]["curves"]
    assert curves["found"][0] == 0 and curves["found"][-1] == 1  # unpruned: at the whole grid, every study holds it
    assert all(lo <= mid <= hi for lo, mid, hi in zip(curves["regret_p10"], curves["regret_p50"], curves["regret_p90"]))
    fig = figure({"rows": rows, "choice": {"rule": "median_late"}})
    assert len(fig.data) == 4 * 3  # per row: the share, the regret median, and a band (both rules are banded)
    lines = [(s.type, s.y0 if s.y0 == s.y1 else s.x0) for s in fig.layout.shapes]
    assert lines.count(("line", rule_choice.GOAL_FOUND)) == 2 and lines.count(("line", rule_choice.GOAL_SHARE)) == 4
    assert fig.layout.yaxis3.type == "log" and min(fig.data[2].y) >= REGRET_FLOOR


def two_seeds() -> tuple[Table, Table]:
    """Ten configurations on two training seeds: configuration 0 is the best on seed 0 alone (a lucky seed), 1 is
    the best on average; the rest are far behind."""
    ends = {0: (0.95, 0.55), 1: (0.90, 0.92)}

    def table(seed: int) -> Table:
        curves = {}
        for i in range(10):
            end = ends.get(i, (0.3, 0.3))[seed]
            points = tuple(Point(s, end * s / 400, 0.5, float(s), 0.0) for s in (100, 200, 300, 400))
            curves[config({"arch.hidden_size": i})] = Curve({"arch.hidden_size": i}, points)
        return Table(seed, curves, 256)

    return table(0), table(1)


def test_a_study_is_judged_by_its_reported_configurations_seed_mean_not_by_its_lucky_seed() -> None:
    seed0, seed1 = two_seeds()
    named = {"tiny:0": seed0, "tiny:1": seed1}
    judge = truths(named, named)
    truth, said = judge["tiny:0"]
    assert truth.best_params.startswith("1") and "mean over seeds 0, 1" in said
    lucky = config({"arch.hidden_size": 0})
    # the replays that report configuration 0 hold the best of seed 0's table by the eval SE, not by the seed mean
    runs = [horizon.replay(seed0, "none", s, None) for s in range(8)]
    row = horizon.summarize("tiny:0", seed0, "none", runs, judge["tiny:0"])
    assert all(r.reported[-1] == lucky for r in runs)
    assert row["near_best_eval_at_n_trials"] == 1.0 and row["near_best_at_n_trials"] == 0.0
    assert row["curves"]["found_eval"][-1] == 1.0 and row["curves"]["found"][-1] == 0.0
    assert row["judged_by"] == said and row["truth"]["best"] == pytest.approx((0.90 + 0.92) / 2)


def test_the_one_seed_table_borrows_the_training_seed_sd_at_its_own_horizon_from_the_long_seeds() -> None:
    seed0, seed1 = two_seeds()  # 400 steps; cut at 200, the long seeds' SD is half the one at their end
    thousand = truncated(seed0, 200)
    alone = truths({"1000": thousand}, {"1000": thousand})
    assert alone == {}  # no two long seeds: judged on its eval SE (summarize says so)
    assert horizon.summarize("1000", thousand, "none", [horizon.replay(thousand, "none", 0, None)])["judged_by"] == (
        EVAL_ONLY
    )
    judge = truths({"1000": thousand}, {"1000": thousand, "long:0": seed0, "long:1": seed1})
    truth, said = judge["1000"]
    at_end = seed_truth([seed0, seed1]).seed_sd
    assert truth.seed_sd == pytest.approx(at_end / 2) and truth.se == truth.seed_sd and "step 200" in said
    assert truth.means[config({"arch.hidden_size": 0})] == pytest.approx(0.95 / 2)


def test_the_choice_stays_provisional_until_every_required_table_is_replayed_whole() -> None:
    """A long table joins the replays from horizon.MIN_CURVES curves; the choice waits for all of them."""
    whole = dict(rule_choice.REQUIRED)
    rows = [row(name, "median_late", 0.95, 0.35, n) for name, n in whole.items()]
    assert not rule_choice.choose_rule(rows).provisional
    partial = [r if r["table"] != "long:0" else {**r, "configurations": 14} for r in rows]
    assert rule_choice.choose_rule(partial).provisional
    assert rule_choice.missing_tables({r["table"]: r for r in partial}) == [f"long:0 (14 of {whole['long:0']})"]
    assert rule_choice.missing_tables({r["table"]: r for r in rows[1:]}) == ["tiny:0"]
