"""TRM-Bench-tiny (issue 42): sampler=grid, the wall stamp on each metrics record, the recorder's export of a
real grid study, and replays of sampler x pruner strategies on a table of curves.

The replay tests run on a synthetic table built here (curves shaped by the parameters, with a known best): they
test the replay's bookkeeping, not TRM. The recorder test runs the real platform on two short trials.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pytest
from omegaconf import OmegaConf

from bench.trm_bench import figure as trm_bench_figure
from bench.trm_bench import replay as replay_bench
from bench.trm_bench import table_specs
from bench.trm_bench import tiny as trm_bench_tiny
from bench.trm_bench.table import EVAL_EXAMPLES, config, load
from bench.trm_bench.tiny import curve, record_command
from contracts.eval_noise import binomial_stderr
from contracts.metrics_log import WALL_TIME_KEY, read_metrics
from sweeps.config.schema import Draws
from sweeps.search.distinct_draws import EnumeratingSampler, choose_sampler
from sweeps.search.space import parse_space
from trm.run_end import RunLog
from trm.tracking.tracker import Tracker

ROOT = Path(__file__).resolve().parent.parent
KEYS = ("arch.hidden_size", "arch.L_layers", "arch.H_cycles", "arch.L_cycles", "arch.mixer")


# ------------------------------------------------------------------------------------------- sampler=grid


def test_sampler_grid_enumerates_every_configuration_whatever_the_budget() -> None:
    space = parse_space({"arch.H_cycles": "range(1, 4)", "arch.mixer": "choice(attention, mlp_t)"})
    knobs = Draws(max_redraws=20, enumerate_share=None)  # enumeration by share switched off: grid alone decides
    chosen = choose_sampler(optuna.samplers.BruteForceSampler(seed=3), space, n_trials=2, draws=knobs, seed=3)
    assert isinstance(chosen.base, EnumeratingSampler)  # type: ignore[attr-defined]
    study = optuna.create_study(sampler=chosen)
    seen = set()
    for _ in range(6):
        trial = study.ask()
        seen.add(
            (trial.suggest_int("arch.H_cycles", 1, 3), trial.suggest_categorical("arch.mixer", ["attention", "mlp_t"]))
        )
        study.tell(trial, 0.0)
    assert len(seen) == 6  # 3 x 2: each once


def test_sampler_grid_refuses_an_infinite_space_naming_the_fix() -> None:
    space = parse_space({"optim.lr": "interval(0.0001, 0.01)"})
    with pytest.raises(ValueError, match=r"sampler=grid .* optim.lr is a float range without a step"):
        choose_sampler(optuna.samplers.BruteForceSampler(), space, 10, Draws(max_redraws=20, enumerate_share=0.5), 0)


# ------------------------------------------------------------------------------------- metrics wall stamp


class _Kept(Tracker):
    def __init__(self) -> None:
        self.logged: list[dict[str, float]] = []

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.logged.append(metrics)


def test_each_metrics_record_is_stamped_in_the_file_and_not_sent_to_the_tracker(tmp_path: Path) -> None:
    tracker = _Kept()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        log = RunLog(tmp_path, f, tracker)
        log.log({"step": 50, "eval/exact_accuracy": 0.25})
        log.log({"step": 100, "eval/exact_accuracy": 0.5})
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [50, 100]
    assert records[0][WALL_TIME_KEY] <= records[1][WALL_TIME_KEY]
    assert records[0][WALL_TIME_KEY] > 1.7e9  # epoch seconds
    assert tracker.logged == [{"eval/exact_accuracy": 0.25}, {"eval/exact_accuracy": 0.5}]  # W&B keeps its own time


# ------------------------------------------------------------------------------------------------ export


def _write(run: Path, records: list[dict[str, Any]]) -> None:
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _eval(step: int, exact: float, at: float) -> dict[str, Any]:
    return {"step": step, "eval/exact_accuracy": exact, "eval/blank_accuracy": exact / 2, WALL_TIME_KEY: at}


def test_a_curve_is_read_across_a_retry_chain_and_only_when_every_eval_is_there(tmp_path: Path) -> None:
    first = tmp_path / "trial-3" / "run"  # cut after step 2 (its step-4 eval repeated by the retry)
    _write(first, [_eval(2, 0.1, 100.0), _eval(4, 0.9, 102.0)])
    retry = tmp_path / "trial-5" / "run"
    _write(retry, [_eval(4, 0.2, 150.0), _eval(6, 0.3, 152.0)])
    points = curve([first, retry], flops_per_step=10**9, steps=6, every=2, start=99.0)
    assert points is not None
    assert [(p["step"], p["exact"], p["gflops"], p["wall_s"]) for p in points] == [
        (2, 0.1, 2.0, 1.0),
        (4, 0.2, 4.0, 51.0),  # the retry's record of step 4 wins
        (6, 0.3, 6.0, 53.0),
    ]
    assert curve([retry], 10**9, 6, 2, None) is None  # step 2 missing: not a whole curve
    assert curve([first], 10**9, 6, 2, None) is None  # not trained to the end


@pytest.mark.slow
def test_the_recorder_runs_a_real_grid_study_and_exports_its_curves(tmp_path: Path) -> None:
    smoke = ["train.steps=4", "train.eval_interval=2", "train.log_interval=2", "train.eval_examples=8"]
    smoke += ["data.num_train=64", "data.num_test=16"]
    args = ["--state", str(tmp_path / "state"), "--seeds", "1", "--n-trials", "2", "--jobs", "2"]
    args += [f"--trial-override={o}" for o in smoke]
    env_cmd = [sys.executable, "-m", "bench.trm_bench.tiny"]
    subprocess.run([*env_cmd, "record", *args], cwd=ROOT, check=True, timeout=600)
    out = tmp_path / "table.json"
    subprocess.run([*env_cmd, "export", *args[:4], "--out", str(out)], cwd=ROOT, check=True, timeout=120)
    saved = json.loads(out.read_text())
    rows = saved["seeds"]["1"]
    assert len(rows) == 2 and {r["params"]["arch.hidden_size"] for r in rows} <= {32, 64}
    for row in rows:
        assert [p["step"] for p in row["curve"]] == [2, 4]
        assert 0 < row["curve"][0]["gflops"] < row["curve"][1]["gflops"]
        assert 0 <= row["curve"][0]["wall_s"] <= row["curve"][1]["wall_s"]
    session = saved["recording_sessions"][0]
    assert session["seeds"] == [1] and len(session["commit"]) == 40 and session["machine"]["cpu_model"]
    assert "sampler=grid" in saved["sweeps_run"] and "pruner=none" in saved["sweeps_run"]
    assert not list((tmp_path / "state" / "runs").rglob("confirm"))  # a recording trains no confirm stage
    assert "confirm.at_end=false" in record_command(tmp_path, 1, 1)  # the table's own recording neither
    # seed 1 trains with seed=1: the training seed is the table's seed
    assert "'seed=1'" in record_command(tmp_path, 1, 1)[-1]


# ------------------------------------------------------------------------------------------------ replays


def synthetic_table(path: Path) -> dict[str, Any]:
    """Every configuration of the tiny space with a curve shaped by its parameters: MLP-t learns, attention stays
    at 0 exact accuracy, and 64/2/3/3 MLP-t is the best; deeper recursion costs more FLOPs per step."""
    rows = []
    for h, layers, hc, lc, mixer in itertools.product((32, 64), (1, 2), (1, 2, 3), (1, 2, 3), ("attention", "mlp_t")):
        quality = (0.05 if mixer == "attention" else 0.4) + 0.1 * (h == 64) + 0.05 * layers + 0.03 * hc * lc
        per_step = h / 32 * layers * hc * (lc + 1)
        points = []
        for step in range(50, 501, 50):
            frac = step / 500
            exact = round(quality * frac ** (1 + 0.2 * hc), 4) if mixer == "mlp_t" else 0.0
            points.append({"step": step, "exact": exact, "blank": round(0.1 + quality * frac**0.5, 4),
                           "gflops": per_step * step, "wall_s": float(step)})  # fmt: skip
        rows.append({"params": dict(zip(KEYS, (h, layers, hc, lc, mixer))), "curve": points})
    saved = {"benchmark": "trm_bench_tiny", "seeds": {"0": rows}}
    path.write_text(json.dumps(saved))
    return saved


def test_the_table_knows_its_best_and_target(tmp_path: Path) -> None:
    synthetic_table(tmp_path / "t.json")
    table = load(tmp_path / "t.json", 0)
    assert len(table.curves) == 72 and table.steps == 500
    best = max(c.value for c in table.curves.values())
    assert table.best == best == table.curves[frozenset(zip(KEYS, (64, 2, 3, 3, "mlp_t")))].value
    assert table.target == pytest.approx(best - binomial_stderr(best, EVAL_EXAMPLES))
    with pytest.raises(ValueError, match="no curves for seed 1"):
        load(tmp_path / "t.json", 1)


def test_an_unpruned_grid_replay_trains_every_configuration_until_the_best(tmp_path: Path) -> None:
    synthetic_table(tmp_path / "t.json")
    table = load(tmp_path / "t.json", 0)
    space, baseline = replay_bench.study_conf()
    run = replay_bench.replay(table, replay_bench.Strategy("grid", "none"), 0, space, baseline)
    assert run.pruned == 0 and run.duplicates == 0
    assert run.best[-1] == table.best  # it stops at the best: nothing after it could change what it reports
    assert all(a <= b for a, b in zip(run.best, run.best[1:]))
    spent = [b - a for a, b in zip([0.0, *run.gflops], run.gflops)]
    full = {c.gflops for c in table.curves.values()}
    assert all(s in full for s in spent)  # every trial trained to its end
    assert replay_bench.hit(run, table.target) is not None


def test_a_pruned_replay_stops_trials_at_an_eval_and_spends_less(tmp_path: Path) -> None:
    synthetic_table(tmp_path / "t.json")
    table = load(tmp_path / "t.json", 0)
    space, _ = replay_bench.study_conf()
    unpruned = replay_bench.replay(table, replay_bench.Strategy("random", "none"), 7, space, None)
    pruned = replay_bench.replay(
        table, replay_bench.Strategy("random", "median", "eval/exact_accuracy"), 7, space, None
    )
    assert pruned.pruned > 0
    points = {p.gflops for c in table.curves.values() for p in c.points}
    spent = [b - a for a, b in zip([0.0, *pruned.gflops], pruned.gflops)]
    assert all(any(abs(s - p) < 1e-6 for p in points) for s in spent)  # a pruned trial stops at one of its evals
    grid = table.grid_gflops
    assert replay_bench.best_within(pruned, 0.0) == 0.0
    assert replay_bench.best_within(unpruned, grid) == unpruned.best[-1]
    assert pruned.gflops[-1] < grid


def test_the_summary_reads_compute_to_find_and_regret_off_the_trajectories(tmp_path: Path) -> None:
    synthetic_table(tmp_path / "t.json")
    table = load(tmp_path / "t.json", 0)
    grid = table.grid_gflops
    found_early = replay_bench.Trajectory([0.05 * grid, 0.2 * grid], [table.target - 0.1, table.best], 0, 0)
    never = replay_bench.Trajectory([0.5 * grid, 0.9 * grid], [0.0, table.target - 0.05], 0, 0)
    row = replay_bench.summarize(table, replay_bench.Strategy("random", "none"), [found_early, never])
    assert row["found"] == 0.5
    assert row["compute_to_find_median"] == float("inf")  # half the studies never found one
    assert row["found_at"]["0.10"] == 0.0 and row["found_at"]["0.25"] == 0.5 and row["found_at"]["1.00"] == 0.5
    assert row["median_regret_at"]["0.10"] == pytest.approx((table.se + 0.1 + table.best) / 2)
    assert row["curve"][19] == 0.0 and row["curve"][20] == 0.5 and row["curve"][100] == 0.5
    assert row["found_with_n_trials"]["6"] == 0.5  # the first study found one at its 2nd trial, the other never
    assert row["compute_with_n_trials_median"]["6"] == pytest.approx((0.2 + 0.9) / 2)  # each study's whole spend


def test_every_strategy_is_built_from_the_shipped_conf() -> None:
    names = {s.name for s in replay_bench.strategies(None)}
    assert len(names) == len(replay_bench.SAMPLERS) * (1 + 2 * (len(replay_bench.PRUNERS) - 1))
    for pruner in replay_bench.PRUNERS:
        assert isinstance(replay_bench.build_pruner(pruner, 500), optuna.pruners.BasePruner)
    for sampler in replay_bench.SAMPLERS:
        assert isinstance(replay_bench.build_sampler(sampler, 0), optuna.samplers.BaseSampler)


def _replayed(tmp_path: Path) -> dict[str, Any]:
    synthetic_table(tmp_path / "t.json")
    table = load(tmp_path / "t.json", 0)
    space, baseline = replay_bench.study_conf()
    rows = []
    for strategy in (replay_bench.Strategy("random", "none"), replay_bench.Strategy("random", "median")):
        runs = [replay_bench.replay(table, strategy, seed, space, None) for seed in range(3)]
        rows.append(replay_bench.summarize(table, strategy, runs))
    return {"seed": 0, "target": {"best": table.best, "se": table.se}, "rows": rows}


def test_the_figure_draws_every_strategy_and_colours_only_the_shown(tmp_path: Path) -> None:
    result = _replayed(tmp_path)
    fig = trm_bench_figure.figure(result, ["random/median/blank"])
    assert len(fig.data) == 2 * len(result["rows"])  # a success and a regret line each
    shown = [t for t in fig.data if t.name == "random/median/blank"]
    assert {t.line.color for t in shown} == {shown[0].line.color} and "150,150,150" not in shown[0].line.color
    assert [t.showlegend for t in fig.data if t.name == "random/none/blank"] == [False, False]
    assert list(fig.data[0].y) == result["rows"][0]["curve"]


@pytest.mark.slow
def test_the_figure_is_written_as_html_and_png(tmp_path: Path) -> None:
    result = tmp_path / "replay.json"
    result.write_text(json.dumps(_replayed(tmp_path)))
    subprocess.run(  # a relative path, as docs/benchmarks.md's command gives it (Chromium needs a file:// URI)
        [sys.executable, "-m", "bench.trm_bench.figure", "replay.json", "--show", "random/none/blank"],
        cwd=tmp_path, check=True, timeout=180, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    html = (tmp_path / "replay.html").read_text()
    assert "TRM-Bench-tiny, seed 0" in html and '"name":"random\\u002fnone\\u002fblank"' in html  # "/" escaped
    assert "cdn.plot.ly" in html and len(html) < 200_000  # plotly.js from its CDN, not 4.6 MB inline
    assert (tmp_path / "replay.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_configuration_that_failed_for_good_is_queued_again_within_the_budget(tmp_path: Path) -> None:
    study = optuna.create_study(study_name="trm_bench_tiny_seed0", storage=f"sqlite:///{tmp_path}/seed0.db")
    dists = {"arch.H_cycles": optuna.distributions.IntDistribution(1, 3)}

    def add(h: int, state: optuna.trial.TrialState) -> None:
        value = 0.5 if state == optuna.trial.TrialState.COMPLETE else None
        study.add_trial(
            optuna.trial.create_trial(params={"arch.H_cycles": h}, distributions=dists, state=state, value=value)
        )

    add(1, optuna.trial.TrialState.COMPLETE)
    add(2, optuna.trial.TrialState.FAIL)  # failed for good: counts against n_trials, the grid counts it tried
    add(3, optuna.trial.TrialState.FAIL)  # ... failed, but a retry waits: not queued twice
    add(3, optuna.trial.TrialState.WAITING)
    budget = trm_bench_tiny.rerun_failed(tmp_path, 0, configurations=3)
    waiting = [
        t.params or t.system_attrs["fixed_params"]
        for t in study.get_trials()
        if t.state == optuna.trial.TrialState.WAITING
    ]
    assert waiting == [{"arch.H_cycles": 3}, {"arch.H_cycles": 2}]
    assert trm_bench_tiny.rerun_failed(tmp_path, 0, configurations=3) == budget  # run again: nothing queued twice
    assert len(study.get_trials(states=(optuna.trial.TrialState.WAITING,))) == 2
    assert budget == 3 + 3 - 1  # used (the complete and two failed) + the two configurations not complete
    assert trm_bench_tiny.rerun_failed(tmp_path / "none", 0, configurations=72) == 72  # no study yet


def test_a_lost_state_carries_the_committed_curves_and_queues_only_the_rest(tmp_path: Path) -> None:
    table = tmp_path / "committed.json"
    saved = synthetic_table(table)
    kept = [r for r in saved["seeds"]["0"] if r["params"]["arch.H_cycles"] == r["params"]["arch.L_cycles"]]
    saved["seeds"]["0"] = kept
    saved["recording_sessions"] = [{"benchmark": "trm_bench_tiny", "commit": "abc", "seeds": [0]}]
    table.write_text(json.dumps(saved))
    state = tmp_path / "state"
    assert trm_bench_tiny.carry_committed(state, 0, committed=table) == 72 - 24
    study = optuna.load_study(study_name="trm_bench_tiny_seed0", storage=f"sqlite:///{state}/seed0.db")
    queued = [t.system_attrs["fixed_params"] for t in study.get_trials()]
    assert len(queued) == 48 and all(q["arch.H_cycles"] != q["arch.L_cycles"] for q in queued)
    assert trm_bench_tiny.carry_committed(state, 0, committed=table) is None  # the state exists: not carried twice
    assert trm_bench_tiny.carry_committed(state, 1, committed=table) is None  # no committed curves of seed 1
    exported = trm_bench_tiny.export(state, [0])
    assert exported["seeds"]["0"] == sorted(kept, key=lambda r: sorted(r["params"].items()))
    assert exported["recording_sessions"] == saved["recording_sessions"]
    saved["seeds"]["0"] = [r for r in kept if r["params"]["arch.hidden_size"] == 64]  # one width never recorded
    table.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="span 36 configurations, not the space's 72"):
        trm_bench_tiny.carry_committed(tmp_path / "other", 0, committed=table)


def test_a_lost_long_state_queues_the_long_tables_configurations_it_lacks_in_order(tmp_path: Path) -> None:
    """A new session found the long table's state gone: `record --table long` would have trained its 3 committed
    curves again (2.5 job-hours per seed) before any new one."""
    long = table_specs.LONG
    committed = tmp_path / "long.json"
    have = [long.configurations[i] for i in (0, 5, 43)]
    rows = [{"params": dict(p), "curve": [{"step": 2000, "exact": 0.5}]} for p in have]
    committed.write_text(json.dumps({"seeds": {"0": rows}, "recording_sessions": []}))
    state = tmp_path / "state"
    assert trm_bench_tiny.carry_committed(state, 0, long, committed) == 41
    study = optuna.load_study(study_name="trm_bench_long_seed0", storage=f"sqlite:///{state}/seed0.db")
    queued = [t.system_attrs["fixed_params"] for t in study.get_trials()]
    expected = [dict(c) for i, c in enumerate(long.configurations) if i not in (0, 5, 43)]
    assert queued == expected


def test_an_export_keeps_the_committed_seeds_its_state_never_recorded(tmp_path: Path) -> None:
    """On a fresh machine only seed 2 had a state; its export wrote seeds 0 and 1 with 0 curves."""
    table = tmp_path / "committed.json"
    saved = synthetic_table(table)
    saved["recording_sessions"] = [{"benchmark": "trm_bench_tiny", "commit": "abc", "seeds": [0]}]
    table.write_text(json.dumps(saved))
    exported = trm_bench_tiny.export(tmp_path / "state", [0, 1], table)
    assert exported["seeds"]["0"] == saved["seeds"]["0"] and len(exported["seeds"]["0"]) == 72
    assert exported["seeds"]["1"] == saved["seeds"].get("1", [])
    assert exported["recording_sessions"] == saved["recording_sessions"]


def test_a_seed_the_committed_table_completes_is_not_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a fresh machine `record --seeds 0,1` carried seed 0's 72 curves and then ran sweeps.run n_trials=0, which
    refused the budget (exit 2) and stopped the recording before seed 1."""
    table = tmp_path / "committed.json"
    synthetic_table(table)
    carry = trm_bench_tiny.carry_committed
    monkeypatch.setattr(trm_bench_tiny, "carry_committed", lambda state, seed, t: carry(state, seed, t, table))
    monkeypatch.setattr(trm_bench_tiny, "git_commit", lambda: "abc")  # in-process: the fast lane starts no process
    monkeypatch.setattr(trm_bench_tiny.subprocess, "run", lambda cmd, **_: pytest.fail(f"started: {cmd}"))
    assert trm_bench_tiny.record(tmp_path / "state", [0], jobs=1, argv=["record"]) == 0
    assert "seed 0: complete, nothing to train" in capsys.readouterr().out


def test_a_percentile_that_reaches_the_studies_that_never_found_one_says_never() -> None:
    """A strategy whose studies found the target in 3 of 10 replays printed "p90 compute nan" (inf - inf)."""
    from bench._results import percentile

    never = [0.1, 0.2, 0.3] + [math.inf] * 7
    assert percentile(never, 90) == math.inf and percentile(never, 10) == pytest.approx(0.19)
    assert percentile([0.1, 0.2, 0.3], 50) == 0.2


def test_merged_runs_keep_each_strategys_latest_row_and_read_an_old_nan_as_never(tmp_path: Path) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    row = {"strategy": "tpe/none/blank", "compute_to_find_median": 0.1, "trials_to_find_p90": 9.0}
    old = {**row, "strategy": "random/median/blank", "compute_to_find_p90": math.nan, "trials_to_find_p90": math.nan}
    first.write_text(json.dumps({"rows": [{**row, "compute_to_find_p90": 0.5}, old]}))
    second.write_text(json.dumps({"rows": [{**row, "compute_to_find_p90": 0.2}]}))
    rows = {r["strategy"]: r for r in replay_bench.merged_rows([first, second])}
    assert rows["tpe/none/blank"]["compute_to_find_p90"] == 0.2  # the later run's
    assert rows["random/median/blank"]["compute_to_find_p90"] == math.inf
    assert rows["random/median/blank"]["trials_to_find_p90"] == math.inf


def test_model_scaling_ships_the_strategy_the_choice_rule_picks() -> None:
    """Issue 42: the defaults come from the replays, not from belief. model_scaling's sampler and pruner, as conf/
    composes them, are exactly the conf/ files of the strategy bench.trm_bench.choice picks from the committed
    replays of its choice seeds (the least worst-seed compute at which 90% of studies hold a configuration within
    one SE of the best), and the laptop's n_trials is the choice's (finds one in 9 of 10 on every choice seed)."""
    from bench.trm_bench import choice as trm_bench_choice
    from sweeps.config.compose import compose_sweep_config

    choice = trm_bench_choice.choose({s: trm_bench_choice.load_rows(s) for s in trm_bench_choice.CHOICE_SEEDS})
    cfg = compose_sweep_config(["study=model_scaling"])
    for group, name in (("sampler", choice.sampler), ("pruner", choice.pruner)):
        shipped = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / group / f"{name}.yaml"))
        assert OmegaConf.to_container(cfg[group]) == shipped, (group, choice.strategy)
    assert cfg.study.prune_metric == choice.metric or choice.pruner == "none"
    assert cfg.n_trials == choice.n_trials


def test_the_choice_rule_takes_the_best_worst_seed_among_shipped_strategies() -> None:
    """The rule guards against one seed's luck: a strategy best on one seed and poor on the other loses to one good
    on both; a pruner variant that is not a conf/pruner/ file is reported but never chosen; a strategy short of
    MIN_REPS on a seed is not a candidate; n_trials is the worst seed's trials-to-find, rounded up."""
    from bench.trm_bench.choice import MIN_REPS, choose

    def row(name: str, p90: float, trials: float, reps: int = MIN_REPS) -> dict[str, Any]:
        sampler, pruner, _ = name.split("/")
        return {
            "strategy": name, "sampler": sampler, "pruner": pruner, "metric": "eval/blank_accuracy", "reps": reps,
            "compute_to_find_p90": p90, "compute_to_find_median": p90 / 2, "trials_to_find_p90": trials,
        }  # fmt: skip

    seed0 = [row("gp/none/blank", 0.15, 9), row("tpe/median_late/blank", 0.24, 23), row("tpe/median_40/blank", 0.2, 20)]
    seed1 = [
        row("gp/none/blank", 0.65, 46),
        row("tpe/median_late/blank", 0.34, 38.2),
        row("tpe/median_40/blank", 0.3, 30),
    ]
    seed1.append(row("random/none/blank", 0.1, 5, reps=MIN_REPS - 1))
    seed0.append(row("random/none/blank", 0.1, 5))
    by_seed = {0: {r["strategy"]: r for r in seed0}, 1: {r["strategy"]: r for r in seed1}}
    choice = choose(by_seed)
    assert (choice.strategy, choice.n_trials, choice.worst_p90) == ("tpe/median_late/blank", 39, 0.34)
    by_seed[1]["tpe/median_late/blank"]["compute_to_find_p90"] = math.inf  # never found on one seed: worst is inf
    assert choose(by_seed).strategy == "gp/none/blank"


def test_the_long_table_queues_its_configurations_in_one_order_for_every_seed(tmp_path: Path) -> None:
    """`--table long` records a subset of the space: every MLP-t configuration and 8 attention ones, queued before
    the first sweeps.run in one shuffled order shared by the seeds (so seeds recorded side by side hold the same
    configurations), the MLP-t ones first, at 2,000 steps with evals every 100 steps on 512 puzzles."""
    long = table_specs.LONG
    assert trm_bench_tiny.queue_configurations(tmp_path, 0, long)
    assert trm_bench_tiny.queue_configurations(tmp_path, 1, long)
    assert not trm_bench_tiny.queue_configurations(tmp_path, 0, long)  # an existing study keeps its own queue
    assert not trm_bench_tiny.queue_configurations(tmp_path, 2, table_specs.TINY)  # the grid's table: no queue
    orders = []
    for seed in (0, 1):
        study = optuna.load_study(
            study_name=table_specs.study_name(seed, long), storage=f"sqlite:///{tmp_path}/seed{seed}.db"
        )
        waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
        orders.append([t.system_attrs["fixed_params"] for t in waiting])
    assert orders[0] == orders[1] and len(orders[0]) == 44
    assert len({config(p) for p in orders[0]}) == 44  # no configuration twice
    mixers = [p["arch.mixer"] for p in orders[0]]
    assert mixers.count("mlp_t") == 36 and mixers.count("attention") == 8
    attention = {
        (p["arch.hidden_size"], p["arch.L_layers"], p["arch.H_cycles"])
        for p in orders[0]
        if p["arch.mixer"] == "attention"
    }
    assert attention == set(itertools.product((32, 64), (1, 2), (1, 3)))  # both widths, layer counts, depth ends
    assert mixers == ["mlp_t"] * 36 + ["attention"] * 8  # the MLP-t sub-grid whole before any attention one
    shapes = [(p["arch.hidden_size"], p["arch.L_layers"], p["arch.H_cycles"]) for p in orders[0][:8]]
    assert shapes != sorted(shapes)  # shuffled: a partial table is spread over the sub-grid
    command = record_command(tmp_path, 1, 1, table=long)
    assert "n_trials=44" in command and f"study.name={table_specs.study_name(1, long)}" in command
    trial = command[-1]
    for override in ("'train.steps=2000'", "'train.eval_interval=100'", "'train.eval_examples=512'", "'seed=1'"):
        assert override in trial


# ----------------------------------------------------------------------------- replays that count a pod's cost


def _synthetic_seeds(path: Path, shifts: dict[int, float]) -> None:
    """synthetic_table's curves for several seeds, each seed's exact accuracy moved by its shift (the training
    seed's effect), its wall seconds stretched by the seed (a recording machine shared with other work)."""
    rows = synthetic_table(path)["seeds"]["0"]
    seeds = {}
    for seed, shift in shifts.items():
        seeds[str(seed)] = [
            {
                "params": r["params"],
                "curve": [
                    p
                    | {"exact": max(0.0, p["exact"] + shift) if p["exact"] else 0.0, "wall_s": p["wall_s"] * (1 + seed)}
                    for p in r["curve"]
                ],
            }
            for r in rows
        ]
    path.write_text(json.dumps({"benchmark": "trm_bench_tiny", "seeds": seeds}))


def test_the_seed_mean_truth_pools_the_training_seed_sd_over_the_top(tmp_path: Path) -> None:
    from bench.trm_bench.table import seed_truth

    _synthetic_seeds(tmp_path / "t.json", {0: 0.0, 1: 0.1, 2: -0.1})
    tables = [load(tmp_path / "t.json", s) for s in (0, 1, 2)]
    truth = seed_truth(tables, pooled_over=4)
    best = config(dict(zip(KEYS, (64, 2, 3, 3, "mlp_t"))))
    assert truth.means[best] == pytest.approx(tables[0].curves[best].value) == pytest.approx(truth.best)
    assert truth.seed_sd == pytest.approx(0.1)  # every top configuration moves by -0.1, 0, +0.1 across the seeds
    assert truth.se == pytest.approx(0.1 / math.sqrt(3)) and truth.target == pytest.approx(truth.best - truth.se)
    assert truth.near_best(best) and not truth.near_best(config(dict(zip(KEYS, (32, 1, 1, 1, "mlp_t")))))
    with pytest.raises(ValueError, match="at least 2 seeds"):
        seed_truth(tables[:1])


def test_one_trial_at_a_time_with_no_start_up_is_the_sequential_replay(tmp_path: Path) -> None:
    """The pod replay's event loop stands in for bench/trm_bench/replay.py's loop at W=1: the same trials, pruned at
    the same evals, the same best after each."""
    from bench.trm_bench import pod

    synthetic_table(tmp_path / "t.json")
    table = load(tmp_path / "t.json", 0)
    space, baseline = replay_bench.study_conf()
    strategy = replay_bench.Strategy("tpe", "median_late")
    sequential = replay_bench.replay(table, strategy, 3, space, baseline)
    n = len(sequential.best)
    study = pod.replay_pod(table, strategy, 3, space, baseline, workers=1, n_trials=n, startup_s=0.0)
    assert [e.reported_value for e in study.ends] == sequential.best
    assert study.pruned == sequential.pruned > 0
    # one at a time: the slice's time is the sum of the trials' own, and it pays no idle worker
    assert study.paid_s == pytest.approx(study.ends[-1].used_s)


def test_trials_at_once_pay_their_start_up_and_the_idle_workers(tmp_path: Path) -> None:
    from bench.trm_bench import pod

    synthetic_table(tmp_path / "t.json")
    table = load(tmp_path / "t.json", 0)
    space, baseline = replay_bench.study_conf()
    strategy = replay_bench.Strategy("random", "none")
    one = pod.replay_pod(table, strategy, 5, space, baseline, workers=1, n_trials=12, startup_s=7.0)
    eight = pod.replay_pod(table, strategy, 5, space, baseline, workers=8, n_trials=12, startup_s=7.0)
    assert len(one.ends) == len(eight.ends) == 12  # the study's own budget
    assert one.pruned == 0 and one.ends[-1].used_s == pytest.approx(12 * (500.0 + 7.0))  # synthetic: 1 s a step
    assert eight.wall_s < one.wall_s  # 8 at once end sooner ...
    assert eight.paid_s > eight.ends[-1].used_s  # ... and pay for workers idle once fewer than 8 trials are left
    assert all(a.at_s <= b.at_s for a, b in zip(eight.ends, eight.ends[1:]))
    grid = pod.grid_cost_s(table, 7.0)
    assert grid == pytest.approx(sum(500.0 + 7.0 for _ in table.curves))  # synthetic wall_s: one per step


def test_seconds_are_each_configurations_steady_pace_over_the_seeds_recordings(tmp_path: Path) -> None:
    from bench.trm_bench import pod

    _synthetic_seeds(tmp_path / "t.json", {0: 0.0, 1: 0.0, 2: 0.0})  # wall stretched x1, x2, x3 by the seed
    tables = [load(tmp_path / "t.json", s) for s in (0, 1, 2)]
    steadied = pod.with_steady_seconds(tables[2], tables)
    for c, steady in steadied.curves.items():
        assert [p.wall_s for p in steady.points] == pytest.approx([p.wall_s * 2 for p in tables[0].curves[c].points])
        assert [p.exact for p in steady.points] == [p.exact for p in tables[2].curves[c].points]  # only time moves


def test_a_stall_on_every_seed_at_once_costs_the_pod_nothing(tmp_path: Path) -> None:
    """A recording machine shared with a test suite stalls both seeds' jobs in the same minutes: TRM-Bench-long's
    64/1/1/1 attention took 3.7x its steady time on both. The replays charge each configuration its steady pace."""
    from bench.trm_bench import pod

    _synthetic_seeds(tmp_path / "t.json", {0: 0.0, 1: 0.0})
    tables = [load(tmp_path / "t.json", s) for s in (0, 1)]
    stalled = []
    for t in tables:
        curves = {}
        for c, recorded in t.curves.items():  # 1,000 s lost before the third eval, on every seed
            points = tuple(
                replace(p, wall_s=p.wall_s + (1000.0 if i >= 2 else 0.0)) for i, p in enumerate(recorded.points)
            )
            curves[c] = replace(recorded, points=points)
        stalled.append(replace(t, curves=curves))
    raw_stall_s = pod.grid_cost_s(stalled[0], 5.0) - pod.grid_cost_s(tables[0], 5.0)
    assert raw_stall_s == pytest.approx(1000.0 * len(tables[0].curves))  # what the recorded seconds would charge
    assert pod.grid_cost_s(pod.with_steady_seconds(stalled[0], stalled), 5.0) == pytest.approx(
        pod.grid_cost_s(pod.with_steady_seconds(tables[0], tables), 5.0)
    )


def test_the_pod_replay_reads_the_platforms_measured_start_up() -> None:
    from bench.trm_bench import pod

    saved = json.loads(pod.SWEEP_OVERHEAD.read_text())
    local = next(r for r in saved["launchers"] if r["launcher"] == "local")
    assert pod.measured_startup_s() == local["summary"]["median_outside_per_trial_s"] > 0
    assert OmegaConf.load(ROOT / "conf" / "site" / "laptop.yaml").n_trials == pod.SHIPPED_N_TRIALS


def test_the_real_study_check_follows_the_shipped_strategy_and_a_merge_names_its_seed(tmp_path: Path) -> None:
    """The check compared the real study with gp/none/blank's replays after the default moved to TPE; the seed-1
    replay files said "Seed 0" because `--merge` took the default seed."""
    from bench.trm_bench import check as trm_bench_check

    cfg = OmegaConf.load(ROOT / "conf" / "study" / "model_scaling.yaml")
    chosen = {k.split("/")[-1].split("@")[0]: v for e in cfg.defaults if not isinstance(e, str) for k, v in e.items()}
    sampler, pruner, metric = trm_bench_check.shipped_strategy().split("/")
    assert (sampler, pruner, metric) == (
        chosen["sampler"],
        chosen["pruner"],
        cfg.prune_metric.split("/")[1].split("_")[0],
    )
    with pytest.raises(SystemExit) as refused:
        replay_bench.main(["--merge", str(tmp_path / "rows.json")])
    assert refused.value.code == 2
    for seed in (0, 1, 2):
        saved = json.loads((ROOT / "bench" / "results" / f"trm_bench_replay_seed{seed}.json").read_text())
        assert saved["seed"] == seed
        header = (ROOT / "bench" / "results" / f"trm_bench_replay_seed{seed}.md").read_text().splitlines()[0]
        assert header.startswith(f"Seed {seed}:")


# ------------------------------------------------------------------------------ confirm stages replayed


def test_a_replayed_confirm_stage_ranks_the_top_by_their_mean_over_fresh_seeds(tmp_path: Path) -> None:
    """The study's own seed favours a lucky configuration; trained again on the fresh seeds, the configuration
    best in the mean wins, through the platform's own ranking (sweeps.trials.confirm_rank)."""
    from bench.trm_bench import confirm as bench_confirm
    from bench.trm_bench.pod import PodStudy, trial_seconds
    from bench.trm_bench.table import seed_truth

    _synthetic_seeds(tmp_path / "t.json", {0: 0.0, 1: 0.0, 2: 0.0})
    tables = [load(tmp_path / "t.json", s) for s in (0, 1, 2)]
    good = config(dict(zip(KEYS, (64, 2, 3, 3, "mlp_t"))))  # the synthetic best on every seed
    lucky = config(dict(zip(KEYS, (32, 1, 1, 1, "mlp_t"))))
    study = PodStudy(1, completed=[(lucky, 0.99), (good, tables[0].curves[good].value)])
    winner, seconds = bench_confirm.confirm(study, tables[0], tables[1:], top_k=2, startup_s=5.0)
    assert winner == good
    fresh_s = sum(trial_seconds(t.curves[c], 5.0) for c in (lucky, good) for t in tables[1:])
    assert seconds == pytest.approx(fresh_s)
    assert bench_confirm.confirm(study, tables[0], tables[1:], top_k=1, startup_s=5.0)[0] == lucky  # top 1: kept
    assert [t.seed for t in bench_confirm.fresh_seeds(tables, 2, 2)] == [0, 1]  # wraps around
    truth = seed_truth(tables)
    assert bench_confirm.judge(truth, [good, lucky, None]) == pytest.approx(1 / 3)


def test_study_seeds_is_replayed_on_the_mean_curve_at_its_summed_cost(tmp_path: Path) -> None:
    from bench.trm_bench import confirm as bench_confirm

    _synthetic_seeds(tmp_path / "t.json", {0: 0.0, 1: 0.1, 2: -0.1})
    tables = [load(tmp_path / "t.json", s) for s in (0, 1, 2)]
    mean = bench_confirm.mean_table(tables[:2])
    c = config(dict(zip(KEYS, (64, 2, 3, 3, "mlp_t"))))
    a, b, m = tables[0].curves[c].points[-1], tables[1].curves[c].points[-1], mean.curves[c].points[-1]
    assert m.exact == pytest.approx((a.exact + b.exact) / 2) and m.gflops == pytest.approx(a.gflops + b.gflops)
    assert m.wall_s == pytest.approx(a.wall_s + b.wall_s) and mean.seed == 0


def test_an_evals_own_seconds_are_read_between_its_steps_training_and_eval_records(tmp_path: Path) -> None:
    """The pod replays count evals by what the platform measured: the job logs a step's training record, then
    evaluates, then logs the eval record; an eval step with no training record has no eval_s."""
    run = tmp_path / "trial-0" / "run"
    train = {"step": 2, "train/lm_loss": 1.0, WALL_TIME_KEY: 100.0}
    _write(run, [train, _eval(2, 0.1, 103.5), _eval(4, 0.2, 110.0)])
    points = curve([run], flops_per_step=10**9, steps=4, every=2, start=99.0)
    assert points is not None
    assert points[0]["eval_s"] == 3.5 and "eval_s" not in points[1]
    (tmp_path / "t.json").write_text(json.dumps({"seeds": {"0": [{"params": {"a": 1}, "curve": points}]}}))
    table = load(tmp_path / "t.json", 0)
    assert [p.eval_s for p in table.curves[config({"a": 1})].points] == [3.5, None]


def test_the_long_tables_provenance_names_the_recorder_that_reproduces_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long-table session wrote `python bench/trm_bench_long.py ...`, a script that does not exist."""
    ran: list[list[str]] = []
    monkeypatch.setattr(trm_bench_tiny, "git_commit", lambda: "abc")
    monkeypatch.setattr(
        trm_bench_tiny.subprocess, "run", lambda cmd, **_: ran.append(cmd) or subprocess.CompletedProcess(cmd, 0)
    )
    argv = ["record", "--table", "long", "--seeds", "0"]
    assert trm_bench_tiny.record(tmp_path, [0], 1, argv, table=table_specs.LONG) == 0
    session = json.loads((tmp_path / "provenance.jsonl").read_text().splitlines()[0])
    assert session["benchmark"] == "trm_bench_long" and session["seeds"] == [0]
    assert session["command"] == "python -m bench.trm_bench.tiny record --table long --seeds 0"
    assert (ROOT / "bench" / "trm_bench" / "tiny.py").exists() and "study.name=trm_bench_long_seed0" in ran[0]


def test_the_confirm_defaults_are_the_replays_choice() -> None:
    """Issue 55: conf/'s top_k and seeds come from the committed confirm replays (bench/trm_bench/confirm.py), by
    the rule: within 25% extra cost on every table seed, the best worst-seed near-best rate, then the least cost."""
    from bench.trm_bench import confirm as bench_confirm
    from sweeps.config.compose import compose_sweep_config

    rows = json.loads((ROOT / "bench" / "results" / "trm_bench_confirm.json").read_text())["rows"]
    cfg = compose_sweep_config(["study=model_scaling"])
    assert bench_confirm.choose(rows) == (cfg.confirm.top_k, cfg.confirm.seeds)
    assert cfg.confirm.at_end  # the laptop site confirms its winner


def test_the_confirm_choice_rule_keeps_the_cost_bound_before_the_rate() -> None:
    from bench.trm_bench import confirm as bench_confirm

    def arm(k: int, n: int, rates: tuple[float, float], costs: tuple[float, float]) -> list[dict[str, Any]]:
        return [
            {"seed": s, "top_k": k, "seeds": n, "near_best": r, "extra_cost_median": c}
            for s, r, c in zip((0, 1), rates, costs)
        ]

    rows = [{"seed": 0, "arm": "unconfirmed", "near_best": 0.99, "extra_cost_median": 0.0}]
    rows += (
        arm(1, 1, (0.90, 0.92), (0.02, 0.03)) + arm(5, 2, (1.0, 1.0), (0.2, 0.3)) + arm(3, 1, (0.95, 0.93), (0.1, 0.2))
    )
    rows += arm(2, 1, (0.91, 0.99), (0.05, 0.06))
    assert bench_confirm.choose(rows) == (3, 1)  # 5x2 is best but costs 30% on seed 1; 3x1's worst seed beats 2x1's
    with pytest.raises(ValueError, match="no confirm arm costs at most 25%"):
        bench_confirm.choose(arm(5, 2, (1.0, 1.0), (0.2, 0.3)))


def test_an_export_from_a_new_state_keeps_the_committed_curves_it_has_not_recorded(tmp_path: Path) -> None:
    """A long-table state started anew (a fresh machine: the long table is not carried) would export only its own
    curves, and a commit of that export would lose the earlier sessions' ones."""
    table = tmp_path / "committed.json"
    committed = synthetic_table(table)["seeds"]["0"][:3]
    table.write_text(json.dumps({"seeds": {"0": committed}, "recording_sessions": []}))
    state = tmp_path / "state"
    assert trm_bench_tiny.queue_configurations(state, 0, table_specs.LONG)  # a new study, nothing trained yet
    exported = trm_bench_tiny.export(state, [0], table, table_specs.LONG)
    assert sorted(map(str, exported["seeds"]["0"])) == sorted(map(str, committed))
