"""The bench scripts still run and still measure what they claim (smoke runs with --quick; no timing asserted).

Each runs as a user would (`python -m bench.<name> --quick --out-dir DIR`) and its JSON is read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest

from bench.gpu import profile as gpu_profile
from bench.pruning import comparison as pruning_comparison
from bench.pruning import curve_replay
from bench.pruning import evidence as pruning_evidence
from bench.pruning import replays as pruning_replays
from bench.pruning import report as pruning_report
from storage.confirm_record import confirmations
from storage.record import reevals
from sweeps.config.compose import compose_sweep_config
from sweeps.config.optuna_parts import build, pruner_spec

ROOT = Path(__file__).resolve().parent.parent


def run_bench(script: str, out: Path, *args: str, name: str = "") -> dict:
    """`python -m` the bench at bench/<script> (a room's too: pruning/studies.py); its results are <name>.json and .md
    (the script's name unless given)."""
    module = "bench." + script.removesuffix(".py").replace("/", ".")
    proc = subprocess.run(
        [sys.executable, "-m", module, "--quick", "--out-dir", str(out), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    name = name or script.removesuffix(".py")
    assert (out / f"{name}.md").read_text().startswith(("|", "Build")), "the markdown table was not written"
    return json.loads((out / f"{name}.json").read_text())


@pytest.mark.slow
def test_checkpoint_blocking_bench_times_every_setup_each_round(tmp_path: Path) -> None:
    result = run_bench("checkpoint_blocking.py", tmp_path)
    assert result["arch"] == "tiny" and result["bytes"] > 1e6
    assert {k: len(v) for k, v in result["times"].items()} == {
        "direct": 2,
        "staged": 2,
        "upload": 2,
        "staged_back_to_back": 2,
    }
    assert all(t > 0 for times in result["times"].values() for t in times)


@pytest.mark.slow
def test_data_pipeline_bench_builds_and_feeds(tmp_path: Path) -> None:
    result = run_bench("data_pipeline.py", tmp_path)
    build = result["build"]
    assert build["examples"] == 50 * 20 and build["train_split_bytes"] > 50 * 20 * 81
    assert build["median_read_s"] + build["median_augment_s"] + build["median_write_s"] > 0
    local_batches = {row["local_batch"] for row in result["headroom"]}
    assert local_batches == {64, 768, 192, 96}  # the tiny preset, then one host of v4-8 / v4-32 / v4-64
    for row in result["headroom"]:
        assert row["batches_per_s"] > 0 and row["steps_per_s"] > 0
        assert row["headroom"] == pytest.approx(row["batches_per_s"] / row["steps_per_s"])
    assert result["demand"]["paper_flops_per_sample_step"] > 40e9  # the paper MLP-t config (42.7 GFLOP)


@pytest.mark.slow
def test_sweep_overhead_bench_splits_every_trial(tmp_path: Path) -> None:
    result = run_bench("sweep_overhead.py", tmp_path)
    (local,) = result["launchers"]
    summary = local["summary"]
    assert local["states"] == ["COMPLETE"] and summary["trials_timed"] == 2
    assert all(v >= 0 for v in summary["median_s"].values()), summary["median_s"]
    assert 0 < summary["training_s"] < summary["study_wall_s"]
    assert 0 < summary["projected_fraction_5min"] < summary["outside_fraction"] < 1
    # The study's end stages train: left on, the driver's shutdown would count them as overhead.
    study = optuna.load_study(study_name="overhead_local", storage=f"sqlite:///{tmp_path / 'sweep_overhead/local.db'}")
    assert not reevals(study.user_attrs) and not confirmations(study.user_attrs), sorted(study.user_attrs)


def _arm(spec: str, trials: list[tuple[str, int, float | None]]) -> dict:
    """A pruning.json arm from (state, steps, value) per trial: 1 GFLOP per step, an eval every 100 steps."""
    records = [
        {
            "number": n,
            "state": state,
            "params": {"arch.L_cycles": n},
            "value": value,
            "steps": steps,
            "compute_flops": steps * 1e9,
            "intermediate": {},
            "eval": [
                {"step": k, "eval/exact_accuracy": (value or 0.0) * k / steps, "eval/blank_accuracy": k / steps}
                for k in range(100, steps + 1, 100)
            ],
        }
        for n, (state, steps, value) in enumerate(trials)
    ]
    done = [r for r in records if r["state"] == "COMPLETE"]
    best = max(done, key=lambda r: r["value"])
    return {
        "arm": spec,
        "wall_s": sum(steps for _, steps, _ in trials) / 10,
        "trials": records,
        "states": {s: sum(r["state"] == s for r in records) for s in ("COMPLETE", "PRUNED", "FAIL")},
        "trial_steps": sum(r["steps"] for r in records),
        "compute_flops": sum(r["compute_flops"] for r in records),
        "best_value": best["value"],
        "best_trial": best["number"],
    }


@pytest.mark.slow
def test_pruning_bench_summarizes_seeds_from_a_saved_result(tmp_path: Path) -> None:
    """--render of a multi-seed pruning.json: each seed compared with its own unpruned arm, then the medians."""
    pruned = "median+pruner.n_startup_trials=1"
    full = [("COMPLETE", 500, v) for v in (0.90, 0.50, 0.60, 0.70)]
    per_seed = [
        {  # seed 1: the best kept (gap 0.005) for 800 of 2,000 trial-steps: goal met
            "seed": 1,
            "arms": [_arm("none", full), _arm(pruned, [("COMPLETE", 500, 0.895), *[("PRUNED", 100, None)] * 3])],
        },
        {  # seed 2: the best (trial 2, 0.80) pruned: gap 0.10 for 600 of 2,000 trial-steps: goal missed
            "seed": 2,
            "arms": [
                # and a refused duplicate (trained nothing, no eval): counted as FAIL, skipped by the replay
                _arm("none", [*[("COMPLETE", 500, v) for v in (0.70, 0.50, 0.80, 0.60)], ("FAIL", 0, None)]),
                _arm(pruned, [("COMPLETE", 300, 0.70), *[("PRUNED", 100, None)] * 3]),
            ],
        },
    ]
    saved = {"benchmark": "pruning", "study": "model_scaling", "n_trials": 4, "seeds": [1, 2], "per_seed": per_seed}
    (tmp_path / "in.json").write_text(json.dumps(saved))
    proc = subprocess.run(
        [sys.executable, "-m", "bench.pruning.studies", "--render", str(tmp_path / "in.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the aggregation the table printed, on the same input

    result = {**saved, "per_seed": [pruning_comparison.seed_result(r["seed"], r["arms"]) for r in per_seed]}
    reference, arm = pruning_comparison.aggregate(result["per_seed"])
    assert reference["arm"] == "none" and reference["goal_every_seed"] is None
    assert reference["median_steps_ratio"] == 1.0 and reference["median_best_gap"] == 0.0
    one, two = arm["per_seed"]
    assert (one["seed"], one["steps_ratio"], one["flops_ratio"]) == (1, 0.4, 0.4)
    assert one["best_gap"] == pytest.approx(0.005) and one["meets_goal"] and one["meets_goal_steps"]
    assert (two["seed"], two["steps_ratio"], two["flops_ratio"]) == (2, 0.3, 0.3)
    assert two["best_gap"] == pytest.approx(0.10) and two["meets_goal"] is False
    assert arm["median_steps_ratio"] == pytest.approx(0.35) and arm["median_best_gap"] == pytest.approx(0.0525)
    assert arm["goal_every_seed"] is False and arm["goal_seeds"] == 1
    assert reference["per_seed"][1]["states"] == {"COMPLETE": 4, "PRUNED": 0, "FAIL": 1}
    result["aggregate"] = [reference, arm]
    # the summary table (the per-seed replays below it are not compared: Hyperband's brackets hash the study name)
    summary = pruning_report.render(result).split("### Seed 1")[0]
    assert proc.stdout.startswith(summary)
    assert (
        f"| **{pruned}** | **median of 2** | | | **35%** | **35%** | **+0.0525** | no / no (in every seed) |"
        in proc.stdout
    )
    assert "### Seed 1" in proc.stdout and "### Seed 2" in proc.stdout
    # One seed (no --seeds): its arms at the top level, one table row each, the goal judged per arm.
    one_seed = pruning_comparison.seed_result(1, per_seed[0]["arms"])
    single = {**saved, "seed": one_seed.pop("seed"), **one_seed}
    del single["seeds"], single["per_seed"]
    rows = pruning_report.render(single).splitlines()[2:4]
    assert rows[0].startswith("| none | 4 / 0 / 0 | 2000 |") and rows[0].endswith("| 100% | 100% | +0.0000 | - |")
    assert rows[1].startswith(f"| {pruned} | 1 / 3 / 0 | 800 |") and rows[1].endswith("| 40% | 40% | +0.0050 | yes |")


@pytest.mark.slow
def test_pruning_bench_pairs_the_arms_once_per_seed(tmp_path: Path) -> None:
    """Two seeds, two trials a study, every arm of a seed run at once: each pruned arm (Hyperband with --quick's
    min_resource, and an override of its own) compared with its own seed's unpruned one, on the same configurations."""
    pruned = "hyperband+study.prune_metric=eval/blank_accuracy"
    result = run_bench(
        "pruning/studies.py",
        tmp_path,
        "--n-trials",
        "2",
        "--seeds",
        "1,2",
        "--jobs",
        "2",
        "--arms",
        f"none,{pruned}",
        name="pruning",
    )
    assert result["seeds"] == [1, 2] and [r["seed"] for r in result["per_seed"]] == [1, 2]
    for r in result["per_seed"]:
        none, hyperband = r["arms"]
        assert (none["arm"], hyperband["arm"]) == ("none", pruned)
        assert none["states"]["COMPLETE"] == 2 and none["trial_steps"] == 2 * 20  # unpruned: all their steps
        assert f"seed={r['seed']}" in none["command"] and any(f"/seed{r['seed']}/" in o for o in none["command"])
        cmp = r["comparison"][1]
        # Same sampler seed: the first trials are the same configurations, and training is deterministic, so the
        # values both arms reported for them agree exactly.
        assert cmp["shared_configurations"] >= 1 and cmp["max_abs_diff_of_eval_curves"] == 0.0
        assert cmp["steps_ratio"] == hyperband["trial_steps"] / none["trial_steps"]
        assert (
            "pruner.min_resource=10" in hyperband["command"]
            and "study.prune_metric=eval/blank_accuracy" in (hyperband["command"])
        )
    reference, arm = result["aggregate"]
    assert [s["flops_ratio"] for s in arm["per_seed"]] == [
        r["comparison"][1]["flops_ratio"] for r in result["per_seed"]
    ]
    assert arm["goal_every_seed"] == all(s["meets_goal"] for s in arm["per_seed"])


@pytest.mark.slow
def test_storage_latency_bench_counts_every_operation(tmp_path: Path, pg_server_url: str) -> None:
    result = run_bench("storage_latency.py", tmp_path, "--server-url", pg_server_url)
    rows = result["rows"]
    assert {(r["operation"], r["setup"]) for r in rows} >= {
        ("report+should_prune", "ours"),
        ("report+should_prune", "optuna-defaults"),
        ("ask+tell", "ours"),
        ("ask+tell", "optuna-defaults"),
    }
    for r in rows:
        assert 0 < r["p50_ms"] <= r["p99_ms"] and r["ops_per_s"] > 0
        assert r["peak_connections"] >= r["clients"]  # every client process holds at least one connection


@pytest.mark.slow
def test_trainer_vs_reference_bench_runs_our_side_and_writes_the_table(tmp_path: Path) -> None:
    """Without a reference checkout (CI has none): our side of the smallest mode, the matmul peaks, the table."""
    result = run_bench("trainer/vs_reference.py", tmp_path, name="trainer_vs_reference")
    (mode,) = result["modes"]
    assert mode["mode"] == "fp32 eager" and mode["batch"] == 2 and mode["ours_samples_per_s"] > 0
    assert mode["ours_utilization_vs_matmul_peak"] > 0
    assert mode["reference_samples_per_s"] is None and mode["speedup_vs_reference"] is None
    assert result["reference"]["path"] is None
    assert set(result["machine"]["bf16_flags"]) == {"avx512_bf16", "amx_bf16"}
    assert result["matmul"]["layouts"] == ["nn", "nt", "tn"]
    peaks = result["matmul"]["flops_samples"]["bf16"]
    assert peaks == [max(rates.values()) for rates in result["matmul"]["flops_by_layout"]["bf16"]]
    table = (tmp_path / "trainer_vs_reference.md").read_text()
    assert "| fp32 eager | 2 |" in table and "Reference not run" in table


@pytest.mark.slow
def test_gpu_candidates_bench_checks_and_times_every_candidate(tmp_path: Path) -> None:
    """The prepared GPU bench, on this CPU (the fused kernels in Triton's interpreter), without the reference:
    each candidate's gradient check against fp32 and the torch path, each SwiGLU kernel tile's check, its block and
    step timings, the table. Two candidates (fused_mix_swiglu runs every kernel of the others'): the interpreter
    takes a minute a candidate."""
    candidates = ("--candidates", "torch,fused_mix_swiglu")
    result = run_bench(
        "gpu/candidates.py", tmp_path, "--device", "cpu", "--compile", "off", *candidates, name="gpu_candidates"
    )
    checks = {c["choice"]: c for c in result["gradient_check"]}
    assert set(checks) == {"torch", "fused_mix_swiglu"}
    assert checks["torch"]["worst_ratio_to_torch_rounding"] == pytest.approx(1.0)
    assert all(c["passes"] and c["loss"] == pytest.approx(c["torch_loss"], rel=1e-2) for c in checks.values())
    rows = {r["variant"]: r for r in result["variants"]}
    assert set(rows) == {"ours torch", "ours fused_mix_swiglu"}
    assert all(len(r["times_s"]) == 1 and r["samples_per_s"] > 0 and r["first_lm_loss"] for r in rows.values())
    assert rows["ours torch"]["vs_ours_torch"] == pytest.approx(1.0) and rows["ours torch"]["vs_reference"] is None
    tiles = result["tile_check"]  # every tile of the channel SwiGLU's kernels, forced, against torch's products
    assert {t["kernel"] for t in tiles} == {"forward", "backward"} and all(t["passes"] for t in tiles)
    twins = [t["same_bits_as_one_program_per_tile"] for t in tiles]  # a persistent tile vs its one-per-tile twin
    assert twins.count(True) > 0 and twins.count(False) == 0
    sublayer = {c["choice"]: c for c in result["sublayer"]}  # one block alone, each candidate
    assert set(sublayer) == set(checks) and all(c["forward_ms"] > 0 < c["train_ms"] for c in sublayer.values())
    table = (tmp_path / "gpu_candidates.md").read_text()
    assert "| ours fused_mix_swiglu |" in table and "| fused_mix_swiglu | " in table and "| torch | " in table
    fastest = max(rows, key=lambda name: rows[name]["samples_per_s"]).removeprefix("ours ")  # torch, interpreted
    assert result["fastest_passing"] == fastest and f"Fastest that passes: {fastest}." in table


def test_the_fastest_candidate_named_is_one_that_passed_the_gradient_check() -> None:
    """What the prepared GPU call profiles and what `auto` should become: never a faster choice whose gradients
    failed, nor one that did not run."""
    from bench.gpu.candidates import fastest_passing

    checks = [{"choice": c, "passes": ok} for c, ok in (("torch", True), ("fused_mix", False), ("fused_mix_bwd", True))]
    variants = [
        {"variant": "reference", "times_s": [1.0], "samples_per_s": 900.0},
        {"variant": "ours torch", "times_s": [1.0], "samples_per_s": 100.0},
        {"variant": "ours fused_mix", "times_s": [1.0], "samples_per_s": 300.0},  # faster, but its gradients failed
        {"variant": "ours fused_mix_bwd", "times_s": [1.0], "samples_per_s": 200.0},
        {"variant": "ours fused_mix_swiglu", "times_s": [], "samples_per_s": None},  # skipped
    ]
    assert fastest_passing({"gradient_check": checks, "variants": variants}) == "fused_mix_bwd"
    assert fastest_passing({"gradient_check": checks[1:2], "variants": variants}) is None


@pytest.mark.slow
def test_trainer_vs_reference_bench_refuses_a_directory_that_is_no_checkout(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.trainer.vs_reference", "--quick", "--out-dir", str(tmp_path)]
        + ["--ref", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode != 0 and "is not a TinyRecursiveModels checkout" in proc.stderr
    assert not (tmp_path / "trainer_vs_reference.json").exists()


def curve_trial(number: int, h_cycles: int, gflops_per_step: float, values: list[float]) -> dict:
    """A recorded trial as bench/pruning/studies.py saves it: evals every 100 steps, `values` as its exact accuracy."""
    steps = 100 * len(values)
    return {
        "number": number,
        "params": {"arch.H_cycles": h_cycles},
        "steps": steps,
        "compute_flops": gflops_per_step * 1e9 * steps,
        "eval": [{"step": 100 * (i + 1), "eval/exact_accuracy": v} for i, v in enumerate(values)],
    }


def test_grouped_median_replay_compares_a_trial_only_with_its_groups_completed_trials() -> None:
    """Hand-computed: MedianPruner(1 start-up, 0 warm-up) prunes trials 1-3 (each trails trial 0's 0.5 at step 100);
    grouped by H cycles, trial 1 has no completed H=2 peer (kept), trial 2 trails its H=1 peer trial 0 (pruned at
    step 100), trial 3 leads its H=2 peer trial 1 at every step (0.15 > 0.1, 0.3 > 0.2: kept)."""
    trials = [
        curve_trial(0, 1, 1, [0.5, 0.6]),
        curve_trial(1, 2, 1, [0.1, 0.2]),
        curve_trial(2, 1, 1, [0.2, 0.3]),
        curve_trial(3, 2, 1, [0.15, 0.3]),
    ]
    median = lambda: optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0)  # noqa: E731 - a fresh pruner per replay, in one line
    bare = curve_replay.replay_curves(trials, median(), "eval/exact_accuracy")
    grouped = curve_replay.replay_curves(
        trials,
        pruning_replays.GroupedPruner(median(), pruning_replays.GROUPS["the same H cycles"]),
        "eval/exact_accuracy",
    )
    assert (bare["pruned"], bare["steps"]) == ([1, 2, 3], 200 + 3 * 100)
    assert (grouped["pruned"], grouped["steps"]) == ([2], 200 + 200 + 100 + 200)
    assert grouped["study"].trials[3].params == {"arch.H_cycles": 2}  # replayed with its recorded parameters


@pytest.mark.parametrize(
    "make",
    [
        lambda: optuna.pruners.SuccessiveHalvingPruner(min_resource=200, reduction_factor=2),
        lambda: optuna.pruners.HyperbandPruner(min_resource=200, max_resource=300, reduction_factor=2),  # 1 bracket
    ],
    ids=["successive_halving", "hyperband"],
)
def test_halving_on_flop_steps_judges_a_costly_trial_at_its_first_rung_of_flops(make: Callable) -> None:
    """Hand-computed: trial 0 costs 1 GFLOP a step, trial 1 (trailing: 0.2 against 0.6) 4 GFLOPs. With cumulative
    GFLOPs as the step the first rung (200) is trial 0's step 200 but trial 1's step 100 (400 GFLOPs), where it is
    pruned: 400 + 400 GFLOPs in all. With training steps as the step it runs to step 200 (800 GFLOPs) first."""
    trials = [curve_trial(0, 1, 1, [0.5, 0.6, 0.7, 0.8]), curve_trial(1, 1, 4, [0.2, 0.3, 0.4, 0.5])]
    flops = curve_replay.replay_curves(trials, make(), "eval/exact_accuracy", resource="gflops")
    steps = curve_replay.replay_curves(trials, make(), "eval/exact_accuracy", resource="steps")
    assert flops["pruned"] == steps["pruned"] == [1]
    assert flops["flops"] == pytest.approx((400 + 400) * 1e9) and flops["study"].trials[1].last_step == 400
    assert steps["flops"] == pytest.approx((400 + 800) * 1e9) and steps["study"].trials[1].last_step == 200
    assert flops["best"] == steps["best"] == 0.8
    with pytest.raises(ValueError, match=r"resource='flops': expected one of steps, gflops"):
        curve_replay.replay_curves(trials, make(), "eval/exact_accuracy", resource="flops")


def test_pruning_replays_run_optunas_pruners_on_the_saved_curves(tmp_path: Path) -> None:
    """Grouping every trial together, GroupedPruner decides as the bare MedianPruner on the saved 1,000-step
    curves (it only filters trials); Hyperband on GFLOP steps prunes only at or past its first rung of FLOPs, in
    every seed; the script writes its table."""
    saved = json.loads((ROOT / "bench" / "results" / "pruning_1000steps.json").read_text())
    arms = [seed["arms"][0] for seed in saved["per_seed"]]
    for arm in arms:
        median = lambda: optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=100)  # noqa: E731 - a fresh pruner per replay, in one line
        bare = pruning_evidence.replay(arm, median(), "eval/blank_accuracy")
        one_group = pruning_evidence.replay(
            arm, pruning_replays.GroupedPruner(median(), lambda p: ()), "eval/blank_accuracy"
        )
        assert bare["pruned"] and (one_group["pruned"], one_group["flops_ratio"]) == (
            bare["pruned"],
            bare["flops_ratio"],
        )
        hyperband = optuna.pruners.HyperbandPruner(1000, pruning_replays.gflops(arms), 3)
        run = curve_replay.replay_curves(arm["trials"], hyperband, "eval/exact_accuracy", resource="gflops")
        stops = [t.last_step for t in run["study"].trials if t.state == optuna.trial.TrialState.PRUNED]
        assert stops and min(stops) >= 1000, stops
    result = pruning_replays.main(["--out-dir", str(tmp_path)])
    assert len(result["rows"]) == len(pruning_replays.rules(arms)) > 60
    assert (tmp_path / "pruning_replays.md").read_text().startswith("Replays")


@pytest.mark.slow
def test_cpu_profile_bench_accounts_for_every_matmul_flop(tmp_path: Path) -> None:
    """The profile's matmuls, read from the profiler's input shapes, are exactly the FLOPs trm.flops counts for
    the step (FlopCounterMode): no matmul is missed or double counted, so its per-shape shares can be trusted."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.trainer.cpu_profile", "--quick", "--out-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads((tmp_path / "cpu_profile.json").read_text())
    assert result["precision"] == "fp32" and result["compile"] == "off" and result["batch"] == 2
    assert result["matmul_flops_per_step"] == pytest.approx(result["flops_per_step"], rel=1e-9)
    assert {"matmul", "optimizer"} <= set(result["s_per_step_by_kind"])
    assert all(s["op"] in ("aten::mm", "aten::bmm", "aten::addmm") for s in result["matmul_shapes"])
    assert "| matmul |" in (tmp_path / "cpu_profile.md").read_text()


def test_median_late_keeps_each_saved_studys_best_in_its_replay() -> None:
    """docs/benchmarks.md (TRM-Bench-tiny): `pruner=median_late` on model_scaling's prune metric, as conf/ builds
    them, chosen on 500-step curves, replayed on the three saved 1,000-step studies keeps each unpruned best within
    one eval standard error, for less compute than the bare Hyperband on exact accuracy. The same median rule from
    40% of the trial lost the best in all three (deeper recursion catches up until then)."""
    cfg = compose_sweep_config(["study=model_scaling", "pruner=median_late"])
    saved = json.loads((ROOT / "bench" / "results" / "pruning_1000steps.json").read_text())
    shipped_flops, before_flops = [], []
    for seed in saved["per_seed"]:
        unpruned = seed["arms"][0]
        shipped = pruning_evidence.replay(unpruned, build(pruner_spec(cfg.pruner, 1000)), cfg.study.prune_metric)
        before = pruning_evidence.replay(unpruned, optuna.pruners.HyperbandPruner(100, 1000, 3), "eval/exact_accuracy")
        at_40 = pruning_evidence.replay(unpruned, optuna.pruners.MedianPruner(3, 400), cfg.study.prune_metric)
        assert shipped["kept"] and shipped["pruned"], (seed["seed"], shipped)
        assert before["kept"] and not at_40["kept"]
        shipped_flops.append(shipped["flops_ratio"])
        before_flops.append(before["flops_ratio"])
    assert sum(shipped_flops) < sum(before_flops) < 3.0  # 87% against 94% of the unpruned FLOPs, on average


def test_pruning_settled_compares_only_the_trials_every_arm_settled() -> None:
    """A stopped run: trial 2 settled in one arm only, so both are compared on trials 0-1; the pruned arm's best
    within one eval SE of the reference's is kept, its FLOPs are the share of the reference's."""
    from bench.pruning.settled import compare
    from trm.reeval import binomial_stderr

    def trial(number: int, state: str, value: float | None, flops: float) -> dict:
        return {"number": number, "state": state, "value": value, "steps": 10, "compute_flops": flops, "params": {}}

    reference = {
        0: trial(0, "COMPLETE", 0.90, 4e12),
        1: trial(1, "COMPLETE", 0.95, 4e12),
        2: trial(2, "COMPLETE", 0.99, 4e12),
    }
    pruned = {0: trial(0, "COMPLETE", 0.90, 4e12), 1: trial(1, "PRUNED", None, 1e12), 2: trial(2, "RUNNING", None, 0)}
    result = compare({"none": reference, "evidence": pruned}, eval_examples=100)
    assert result["settled_trials"] == 2
    stderr = result["reference_stderr"]
    assert stderr == binomial_stderr(0.95, 100) and abs(stderr - (0.95 * 0.05 / 100) ** 0.5) < 0.001  # as the study's
    arm = result["arms"]["evidence"]
    assert (arm["complete"], arm["pruned"], arm["best_trial"]) == (1, 1, 0)
    assert arm["flops_ratio"] == 5e12 / 8e12
    assert abs(arm["gap"] - 0.05) < 1e-12 and not arm["kept"]  # 0.05 > one SE (0.0221)
    assert result["arms"]["none"]["kept"]


def test_the_gpu_profile_counts_our_triton_kernels_apart_from_inductors() -> None:
    """Kernel names as torch.profiler reports them on a GPU (bench/results/gpu_profile_h100_*.json): each of ours
    (trm/fused_*.py) in its own kind, before the generic Triton match that inductor's kernels fall under."""
    ours = ("_mix_kernel", "_mix_grad_kernel", "_swiglu_kernel", "_swiglu_grad_kernel")
    assert {gpu_profile.kind_of(name) for name in ours} == {"ours (trm/fused_*.py)"}
    assert gpu_profile.kind_of("triton_poi_fused__unsafe_view_mul_silu_split_7") == "fused (triton)"
    assert gpu_profile.kind_of("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN") == "matmul"


@pytest.mark.slow
@pytest.mark.parametrize("stream", ["bf16", "fp32"])
def test_every_fused_kernel_tile_compiles_to_hopper_tensor_cores(tmp_path: Path, stream: str) -> None:
    """What trm/kernels/fused_mix.py and trm/kernels/fused_swiglu.py promise for their tiles, read off Triton's sm_90
    compile (bench/gpu/triton_sm90.py) on this CPU, for both streams (bf16_reference's bf16, bf16's fp32): wgmma dots fed by
    TMA copies, shared memory within a block's 227 KB, and no register spills."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu.triton_sm90", "--stream", stream, "--out-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    kernels = json.loads((tmp_path / "triton_sm90.json").read_text())["kernels"]
    swiglu_backward = {"fused_swiglu backward"} if stream == "bf16" else set()  # bf16 inputs with either stream
    assert {k["kernel"].split(" (")[0] for k in kernels} == {
        "fused_mix forward", "fused_mix backward", "fused_swiglu forward", *swiglu_backward
    }  # fmt: skip
    for k in kernels:
        assert k["wgmma"] > 0 and k["tma_copies"] > 0, k
        assert k["shared_bytes"] <= 227 * 1024 and 0 < k["registers"] <= 255, k
        assert k["spill_bytes"] == 0 and k["global_loads"] == 0, k  # every copy a TMA copy
