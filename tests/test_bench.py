"""The bench scripts still run and still measure what they claim (smoke runs with --quick; no timing asserted).

Each runs as a user would (`python bench/<script>.py --quick --out-dir DIR`) and its JSON is read back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_bench(script: str, out: Path, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--quick", "--out-dir", str(out), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    name = script.removesuffix(".py")
    assert (out / f"{name}.md").read_text().startswith(("|", "Build")), "the markdown table was not written"
    return json.loads((out / f"{name}.json").read_text())


@pytest.mark.slow
def test_data_pipeline_bench_builds_and_feeds(tmp_path: Path) -> None:
    result = run_bench("data_pipeline.py", tmp_path)
    build = result["build"]
    assert build["examples"] == 50 * 20 and build["train_split_bytes"] > 50 * 20 * 81
    assert 0 < build["median_read_s"] + build["median_augment_s"] + build["median_write_s"]
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


@pytest.mark.slow
def test_pruning_bench_pairs_the_arms(tmp_path: Path) -> None:
    result = run_bench("pruning.py", tmp_path, "--n-trials", "2", "--arms", "none,hyperband")
    none, hyperband = result["arms"]
    assert none["arm"] == "none" and none["states"]["COMPLETE"] == 2
    assert none["trial_steps"] == 2 * 20  # nothing pruned: every trial ran all its steps
    cmp = result["comparison"][1]
    # Same sampler seed: the first trials are the same configurations, and training is deterministic, so the
    # values both arms reported for them agree exactly.
    assert cmp["shared_configurations"] >= 1 and cmp["max_abs_diff_of_eval_curves"] == 0.0
    assert cmp["steps_ratio"] == hyperband["trial_steps"] / none["trial_steps"]


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
