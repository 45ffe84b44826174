"""bench/trm_bench/subgrid.py and pairs.py: a partial table replayed on the sub-grid it holds whole, and the default
against every bare sampler x pruner pair."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from optuna.distributions import CategoricalDistribution

from bench.trm_bench import pairs, pod, replay, subgrid
from bench.trm_bench.table import config, load
from tests.test_trm_bench import _synthetic_seeds


def _drop(path: Path, keep: Any) -> None:
    """Keep only the rows (of every seed) whose params `keep` accepts."""
    saved = json.loads(path.read_text())
    saved["seeds"] = {s: [r for r in rows if keep(r["params"])] for s, rows in saved["seeds"].items()}
    path.write_text(json.dumps(saved))


def test_a_table_with_the_mlp_t_half_and_some_attention_replays_on_the_mlp_t_sub_grid(tmp_path: Path) -> None:
    """The long table's shape: every MLP-t configuration, a few attention ones. The sampler's space keeps the
    mixer's MLP-t choice only, and the table (the cost's grid, the truth's best) keeps only the MLP-t curves."""
    path = tmp_path / "t.json"
    _synthetic_seeds(path, {0: 0.0, 1: 0.01})
    _drop(path, lambda p: p["arch.mixer"] == "mlp_t" or (p["arch.H_cycles"] == p["arch.L_cycles"] == 1))
    tables, space = pod.seed_tables(path)
    assert space.params["arch.mixer"] == CategoricalDistribution(["mlp_t"])
    assert all(len(t.curves) == 36 for t in tables)
    assert {dict(c)["arch.mixer"] for t in tables for c in t.curves} == {"mlp_t"}
    assert len(load(path, 0).curves) == 40  # the file keeps its 4 attention curves
    study = pod.replay_pod(
        tables[0], replay.Strategy("tpe", "median_late"), 1, space, replay.study_conf()[1], 8, 40, 5.0
    )
    drawn = [c for c, _ in study.completed]
    assert len(study.ends) == 36 and all(dict(c)["arch.mixer"] == "mlp_t" for c in drawn)  # n_trials capped


def test_a_whole_table_replays_on_the_study_space_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    _synthetic_seeds(path, {0: 0.0, 1: 0.0})
    tables, space = pod.seed_tables(path)
    assert space == replay.study_conf()[0] and all(len(t.curves) == 72 for t in tables)


def test_a_table_without_a_whole_sub_grid_is_refused_before_any_replay(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    _synthetic_seeds(path, {0: 0.0, 1: 0.0})
    _drop(path, lambda p: p["arch.hidden_size"] == 32)  # half of each mixer's sub-grid
    with pytest.raises(ValueError, match=r"no whole sub-grid of the space along arch.mixer \(36 of 72"):
        pod.seed_tables(path)


def test_the_sub_grid_must_be_whole_on_every_seed(tmp_path: Path) -> None:
    """A configuration one seed lacks is not in the sub-grid: the truth is a mean over every seed."""
    path = tmp_path / "t.json"
    _synthetic_seeds(path, {0: 0.0, 1: 0.0})
    saved = json.loads(path.read_text())
    gone = {"arch.hidden_size": 64, "arch.L_layers": 2, "arch.H_cycles": 3, "arch.L_cycles": 3, "arch.mixer": "mlp_t"}
    saved["seeds"]["1"] = [r for r in saved["seeds"]["1"] if r["params"] != gone]
    path.write_text(json.dumps(saved))
    tables, space = pod.seed_tables(path)
    assert space.params["arch.mixer"] == CategoricalDistribution(["attention"])
    assert config(gone) not in tables[0].curves


def test_a_continuous_parameter_has_no_grid() -> None:
    with pytest.raises(ValueError, match="optim.lr: .* is not a grid"):
        from optuna.distributions import FloatDistribution

        subgrid.choices("optim.lr", FloatDistribution(1e-4, 1e-2, log=True))


def test_the_default_is_what_model_scalings_study_file_selects() -> None:
    default = pairs.default_strategy()
    study = (pairs.CONF / "study" / "model_scaling.yaml").read_text()
    assert f"override /sampler@_global_.sampler: {default.sampler}" in study
    assert f"override /pruner@_global_.pruner: {default.pruner}" in study
    every = pairs.bare_pairs()
    samplers = {p.stem for p in (pairs.CONF / "sampler").glob("*.yaml")}
    assert {s.sampler for s in every} == samplers and len(every) == len(samplers) * len(pairs.BARE_PRUNERS)
    assert default not in every  # the default's pruner is tuned: not a bare one


@pytest.mark.parametrize("pruner", pairs.BARE_PRUNERS)
def test_a_bare_pruner_is_optunas_own_at_its_own_settings(pruner: str) -> None:
    """A bare pair's pruner is an optuna.pruners class with no setting but what it needs for the study's steps."""
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(OmegaConf.load(pairs.CONF / "pruner" / f"{pruner}.yaml"))
    assert isinstance(node, dict) and str(node["_target_"]).startswith("optuna.pruners.")
    built = replay.build_pruner(pruner, 500)
    assert type(built).__module__.startswith("optuna.pruners")


def test_the_default_beats_a_pair_by_more_near_best_studies_or_as_many_for_less() -> None:
    row = {"near_best_at_end": 0.8, "paid_at_end_median": 0.4}
    assert pairs.beats(row, {"near_best_at_end": 0.7, "paid_at_end_median": 0.1})
    assert not pairs.beats(row, {"near_best_at_end": 0.9, "paid_at_end_median": 0.9})
    assert pairs.beats(row, {"near_best_at_end": 0.8, "paid_at_end_median": 0.5})
    assert not pairs.beats(row, {"near_best_at_end": 0.8, "paid_at_end_median": 0.4})


def test_the_pairs_run_on_the_seed_where_the_default_does_worst(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.json"
    _synthetic_seeds(path, {0: 0.0, 1: -0.3, 2: 0.0})  # seed 1's best MLP-t curves fall under the seed-mean target
    # random samplers: milliseconds a study where TPE takes seconds (the selection is what is tested)
    some = [
        replay.Strategy("random", "none", pairs.PRUNE_METRIC),
        replay.Strategy("grid", "median", pairs.PRUNE_METRIC),
    ]
    monkeypatch.setattr(pairs, "bare_pairs", lambda conf=pairs.CONF: some)
    monkeypatch.setattr(pairs, "default_strategy", lambda conf=pairs.CONF: replay.Strategy("random", "median_late"))
    h = pairs.replay_horizon("t", path, reps=3, slow_reps=1, jobs=1, startup_s=5.0)
    defaults = [r for r in h.rows if r["default"]]
    assert sorted(r["seed"] for r in defaults) == [0, 1, 2]
    worst = min(defaults, key=lambda r: (r["near_best_at_end"], -r["paid_at_end_median"]))
    assert h.worse_seed == worst["seed"]
    assert [r["strategy"] for r in h.rows if not r["default"]] == [s.name for s in some]
    assert all(r["seed"] == h.worse_seed for r in h.rows if not r["default"])
    for r in h.rows:
        assert r["paid_at_end_p10"] <= r["paid_at_end_median"] <= r["paid_at_end_p90"]
    text = pairs.markdown([h], {"long": "no whole sub-grid"})
    assert f"worse seed {h.worse_seed}" in text and "- long: not replayed: no whole sub-grid" in text


def test_the_figure_draws_every_pair_on_each_horizons_worse_seed_with_the_goal_and_the_budget() -> None:
    from bench.trm_bench.pairs_figure import figure
    from bench.trm_bench.rule_choice import GOAL_FOUND, GOAL_SHARE

    def row(strategy: str, seed: int, default: bool, found: float) -> dict[str, Any]:
        return {"strategy": strategy, "seed": seed, "default": default, "near_best_at_end": found,
                "paid_at_end_median": 0.5, "paid_at_end_p10": 0.4, "paid_at_end_p90": 0.7}  # fmt: skip

    horizons = [
        {"name": name, "steps": steps, "configurations": 72, "worse_seed": 1,
         "rows": [row("tpe/median_late/blank", 0, True, 0.95), row("tpe/median_late/blank", 1, True, 0.9),
                  row("random/none/blank", 1, False, 0.5), row("gp/hyperband/blank", 1, False, 0.6)]}
        for name, steps in (("tiny", 500), ("long", 2000))
    ]  # fmt: skip
    fig = figure({"horizons": horizons, "workers": 8, "n_trials": 40})
    points = [(t.name, t.xaxis, t.y[0], t.marker.symbol) for t in fig.data]
    assert len(points) == 6  # per panel: the default on the worse seed (not on seed 0) and the two pairs
    assert ("tpe/median_late/blank (default)", "x", 0.9, "star") in points
    assert ("gp/hyperband", "x2", 0.6, "x") in points
    assert all(
        t.error_x.array[0] == pytest.approx(0.2) and t.error_x.arrayminus[0] == pytest.approx(0.1) for t in fig.data
    )
    lines = [(s.type, s.y0 if s.type == "line" and s.y0 == s.y1 else s.x0) for s in fig.layout.shapes]
    assert lines.count(("line", GOAL_FOUND)) == 2 and lines.count(("line", GOAL_SHARE)) == 2
