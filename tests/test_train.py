"""The training loop: a real (tiny) run, resume continuity, outputs, and bad input before training starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.hydra_app import TrainJob, compose_train_config
from contracts.metrics_log import read_metrics
from trm.checkpoints import checkpoint
from trm.data.format import DatasetError
from trm.job_inputs import check_batch
from trm.runtime.base import Runtime
from trm.train import run

# Small enough for CI: a 16-wide model on 200 generated puzzles (conf/experiment/test_tiny.yaml).
FAST = [
    "experiment=test_tiny",
    "train.log_interval=5",
    "train.eval_interval=10",
    "halting.exploration_prob=0.5",  # exercise the RNG path, which resume must restore
]


def config(tmp_path: Path, data_root: Path, *extra: str) -> TrainJob:
    """The job `python -m trm.train <FAST> <extra>` would run, writing to `tmp_path`."""
    return TrainJob.of(compose_train_config([*FAST, f"data.root={data_root}", f"out_dir={tmp_path}", *extra]))


def train_losses(records: list[dict]) -> dict[int, float]:
    return {r["step"]: r["train/lm_loss"] for r in records if "train/lm_loss" in r}


@pytest.mark.slow
def test_run_writes_metrics_checkpoints_and_summary(tmp_path: Path, data_root: Path) -> None:
    summary = run(config(tmp_path, data_root, "train.steps=20"))
    assert summary.outcome == "COMPLETE" and summary.steps == 20
    records = read_metrics(tmp_path)
    assert sorted(train_losses(records)) == [5, 10, 15, 20]
    evals = [r for r in records if "eval/exact_accuracy" in r]
    assert [r["step"] for r in evals] == [10, 20]
    for key in ("accuracy", "exact_accuracy", "q_halt_accuracy", "steps", "lm_loss", "q_halt_loss"):
        assert f"eval/{key}" in evals[0] and f"train/{key}" in records[0]
    assert evals[0]["eval/halted_examples"] == 32  # the whole fixed eval subset, every example once
    assert evals[0]["eval/steps"] == 3  # eval runs all halting steps
    assert summary.best_step in (10, 20)
    assert summary.best_value == max(r["eval/exact_accuracy"] for r in evals)
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["outcome"] == "COMPLETE" and saved["params"] == summary.params
    # Step speed from the first log point (5) on, the evals at 10 and 20 taken out (trm/measures/throughput.py).
    speed = saved["throughput"]
    assert (speed["steps"], speed["devices"], speed["examples_per_device"]) == (15, 1, 16.0)
    timing = saved["timing"]
    assert 0 < speed["seconds"] < timing["last_step_end"] - timing["first_step_end"]
    assert speed["samples_per_s"] == pytest.approx(16 * 15 / speed["seconds"], rel=1e-3)
    assert speed["compiles"]["in_timed_steps"] == {"compiles": 0, "graphs": 0}  # eager: TorchDynamo compiled nothing
    state = checkpoint.load(str(tmp_path / "checkpoints"))
    assert state["step"] == 20 and {"model", "ema", "optimizers", "loader", "ranks", "best"} <= set(state)
    assert checkpoint.load(str(tmp_path / "checkpoints"), checkpoint.BEST) is not None


@pytest.mark.slow
def test_resume_continues_with_the_same_losses(tmp_path: Path, data_root: Path) -> None:
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run(config(straight, data_root, "train.steps=30"))
    # Same run, stopped after 10 steps (its checkpoint), then started again to 30.
    run(config(resumed, data_root, "train.steps=30", "+train.stop_after=10"))
    assert max(train_losses(read_metrics(resumed))) == 10
    run(config(resumed, data_root, "train.steps=30"))
    expected = train_losses(read_metrics(straight))
    got = train_losses(read_metrics(resumed))
    assert sorted(got) == sorted(expected) == [5, 10, 15, 20, 25, 30]
    for step in expected:
        assert got[step] == pytest.approx(expected[step], rel=1e-5, abs=1e-6), step

    def evals(recs: list[dict]) -> dict:
        return {r["step"]: r["eval/accuracy"] for r in recs if "eval/accuracy" in r}

    assert evals(read_metrics(resumed)) == pytest.approx(evals(read_metrics(straight)), rel=1e-5)


@pytest.mark.slow
def test_a_checkpoint_of_another_run_is_refused_not_resumed(tmp_path: Path, data_root: Path) -> None:
    """Resuming what another config wrote would record a result for training that never happened (issue:
    `optim.lr=0.5 seed=7` over a step-20 run trained nothing; `train.steps=10` over it was COMPLETE with no eval)."""
    run(config(tmp_path, data_root, "train.steps=20"))
    before = checkpoint.load(str(tmp_path / "checkpoints"))
    with pytest.raises(
        checkpoint.CheckpointMismatchError, match=r"optim.lr: 0.001 there, 0.5 here; seed: 0 there, 7 here"
    ) as err:
        run(config(tmp_path, data_root, "train.steps=20", "optim.lr=0.5", "seed=7"))
    assert "checkpoint.resume=false" in str(err.value) and str(tmp_path / "checkpoints" / "latest.pt") in str(err.value)
    with pytest.raises(checkpoint.CheckpointMismatchError, match=r"train.steps: 20 there, 10 here"):
        run(config(tmp_path, data_root, "train.steps=10"))
    with pytest.raises(checkpoint.CheckpointMismatchError, match=r"arch.hidden_size: 16 there, 32 here"):
        run(config(tmp_path, data_root, "train.steps=20", "arch.hidden_size=32"))
    after = checkpoint.load(str(tmp_path / "checkpoints"))
    assert after["step"] == before["step"] == 20  # the refused runs wrote nothing over it
    # What may differ between a run and its resumption does not count: where it is watched, when it pauses.
    summary = run(config(tmp_path, data_root, "train.steps=20", "train.progress=true", "wandb.enabled=false"))
    assert summary.outcome == "COMPLETE" and summary.steps == 20
    # Starting over is explicit.
    summary = run(config(tmp_path, data_root, "train.steps=10", "checkpoint.resume=false"))
    assert summary.steps == 10 and checkpoint.load(str(tmp_path / "checkpoints"))["step"] == 10


@pytest.mark.slow
def test_a_checkpoint_without_identity_is_refused(tmp_path: Path, data_root: Path) -> None:
    run(config(tmp_path, data_root, "train.steps=10"))
    state = checkpoint.load(str(tmp_path / "checkpoints"))
    del state[checkpoint.IDENTITY]
    checkpoint.save(str(tmp_path / "checkpoints"), checkpoint.LATEST, state)
    with pytest.raises(checkpoint.CheckpointMismatchError, match="carries no identity"):
        run(config(tmp_path, data_root, "train.steps=20"))


def test_batch_not_divisible_by_world_size_is_rejected(tmp_path: Path, data_root: Path) -> None:
    cfg = config(tmp_path, data_root, "train.global_batch_size=10")
    with pytest.raises(ValueError, match=r"train.global_batch_size=10 is not divisible by the world size 4"):
        check_batch(cfg.app.train, Runtime(world_size=4))


def test_missing_dataset_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dataset"
    cfg = compose_train_config(["data=sudoku_extreme", f"data.path={missing}", f"out_dir={tmp_path}"])
    with pytest.raises(DatasetError, match=str(missing)):
        run(TrainJob.of(cfg))


@pytest.mark.slow
def test_unknown_override_is_one_clear_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trm.train", "train.stepz=5", f"out_dir={tmp_path}"], capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert "train.stepz" in proc.stderr
    assert not (tmp_path / "metrics.jsonl").exists()


def test_bad_compile_choice_names_key(tmp_path: Path, data_root: Path) -> None:
    with pytest.raises(ValueError, match=r"train.compile='fast': .*expected one of \['off', 'net', 'model'"):
        run(config(tmp_path, data_root, "train.compile=fast"))
    assert not (tmp_path / "metrics.jsonl").exists()


def test_impossible_kernels_choice_is_refused_before_training(tmp_path: Path, data_root: Path) -> None:
    """train.kernels (trm/kernel_choice.py): an unknown value, and a fused kernel with fp32, fail naming key and why."""
    with pytest.raises(ValueError, match=r"train.kernels='cutlass': .*expected one of \['auto', 'torch'"):
        run(config(tmp_path, data_root, "train.kernels=cutlass"))
    with pytest.raises(ValueError, match=r"train.kernels=fused_mix: not possible here: .*resolved to fp32"):
        run(config(tmp_path, data_root, "train.kernels=fused_mix", "train.precision=fp32"))
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.slow
def test_a_fused_kernels_run_trains_like_the_torch_run(
    tmp_path: Path, data_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """train.kernels=fused_mix_nograd (here in Triton's interpreter) trains to the torch path's losses to bf16
    rounding, and the start line says which kernels ran and why. Batches of 2: the interpreter's time grows with
    the batch (16 took 100 s, 2 takes 16 s), and the comparison needs no more."""
    extra = (
        "train.steps=2", "train.log_interval=2", "train.eval_interval=2", "train.eval_examples=2",
        "train.global_batch_size=2", "train.eval_batch_size=2",
        "halting.exploration_prob=0.0", "train.ema=false", "train.precision=bf16_reference",
    )  # fmt: skip
    run(config(tmp_path / "torch", data_root, *extra, "train.kernels=torch"))
    capsys.readouterr()
    run(config(tmp_path / "fused", data_root, *extra, "train.kernels=fused_mix_nograd"))
    start = next(json.loads(line) for line in capsys.readouterr().out.splitlines() if '"event": "start"' in line)
    assert start["kernels"] == "fused_mix_nograd (train.kernels=fused_mix_nograd (explicit))"
    want, got = train_losses(read_metrics(tmp_path / "torch")), train_losses(read_metrics(tmp_path / "fused"))
    assert sorted(got) == sorted(want) == [2]
    assert got[2] == pytest.approx(want[2], rel=2e-2)


def test_bad_arch_value_names_key(tmp_path: Path, data_root: Path) -> None:
    with pytest.raises(ValueError, match=r"arch.mixer='conv'"):
        run(config(tmp_path, data_root, "arch.mixer=conv"))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["net", "model"])
def test_compiled_network_trains_like_eager(mode: str, tmp_path: Path, data_root: Path) -> None:
    """train.compile=net compiles the recursed network, =model the whole ACTModel (trm/compiling.py): same losses."""
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    extra = ("train.steps=10", "halting.exploration_prob=0.0", "train.ema=false")
    run(config(eager, data_root, *extra))
    run(config(compiled, data_root, *extra, f"train.compile={mode}"))
    want, got = train_losses(read_metrics(eager)), train_losses(read_metrics(compiled))
    assert sorted(got) == sorted(want) == [5, 10]
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=1e-3), step


@pytest.mark.slow
def test_best_tracking_follows_the_objective_direction(tmp_path: Path, data_root: Path) -> None:
    summary = run(
        config(
            tmp_path, data_root, "train.steps=30", "train.objective=eval/lm_loss", "train.objective_direction=minimize"
        )
    )
    losses = {r["step"]: r["eval/lm_loss"] for r in read_metrics(tmp_path) if "eval/lm_loss" in r}
    assert summary.best_value == pytest.approx(min(losses.values()))
    assert summary.best_step == min(losses, key=losses.get)


@pytest.mark.slow
def test_profile_steps_writes_a_chrome_trace_of_those_steps_and_names_it(tmp_path: Path, data_root: Path) -> None:
    summary = run(config(tmp_path, data_root, "train.steps=8", "train.stop_after=5", "train.profile_steps=[3,4]"))
    assert summary.peak_memory_mb > 50  # the process's peak resident set on a CPU: torch alone is more
    trace = Path(summary.profile)
    assert trace == tmp_path / "profile" / "trace.json"
    assert json.loads((tmp_path / "summary.json").read_text())["profile"] == str(trace)
    events = json.loads(trace.read_text())["traceEvents"]  # the Chrome trace format Perfetto opens
    ops = {e.get("name") for e in events}
    assert "aten::mm" in ops or "aten::addmm" in ops or "aten::linear" in ops  # the model's matmuls were traced
    steps = [e for e in events if e.get("name", "").startswith("ProfilerStep")]
    assert not steps  # one window, started and stopped by hand: no schedule steps
    # resumed past the window (from step 5): nothing is traced again
    summary = run(config(tmp_path, data_root, "train.steps=8", "train.profile_steps=[3,4]"))
    assert summary.profile is None and summary.steps == 8


def test_profile_steps_out_of_order_is_refused_naming_the_key() -> None:
    with pytest.raises(Exception, match=r"train.profile_steps=\[4, 2\]: expected \[first, last\] steps"):
        from contracts.train_config import check_train_config

        check_train_config(compose_train_config(["experiment=test_tiny", "train.profile_steps=[4,2]"]))
