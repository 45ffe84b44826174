"""The real TRM train step on XLA (PJRT CPU): same numbers as CPU eager, SPMD over 4 devices = 1 device,
one compile per graph (static step, no host sync), one recompile per curriculum stage, bf16 autocast.

Every scenario runs trm.train.train_step through the `xla` runtime (tests/xla/_worker.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _lane import result, run_workers

from trm.losses import METRIC_KEYS

LM, QH = METRIC_KEYS.index("lm_loss"), METRIC_KEYS.index("q_halt_loss")
WARMUP = 3  # steps that may compile: the first step, the first with optimizer state, one spare
FLAT = 20  # then this many steps with no compile at all
STAGE_AT = WARMUP + FLAT  # curriculum stage change (H, L) = (2, 1) -> (1, 2)
TAIL = 5  # steps after the stage change: flat again
STEPS = 4

# Equality runs: the full lr from the first step and an active grad clip (its norm sees the loss divisor),
# so the weights move by ~lr per step and a wrong gradient would show.
EXACT = ["--steps", str(STEPS), "optim.warmup_steps=1", "train.grad_clip=0.05"]

SCENARIOS = {  # the longest first: they run two at a time
    "long": {
        "devices": 4,
        "args": [
            "--steps",
            str(STAGE_AT + TAIL),
            "--stage-at",
            str(STAGE_AT),
            "--stage-cycles",
            "1,2",
            "--exploration",
            "0.5",
            "--ema",
            "train.grad_clip=1.0",
            "runtime.backend=xla",
        ],
    },
    "cpu": {"args": [*EXACT, "runtime.backend=single"]},
    "xla1": {"devices": 1, "args": [*EXACT, "runtime.backend=xla"]},
    "xla4": {"devices": 4, "args": [*EXACT, "runtime.backend=xla", "runtime.expected_devices=4"]},
    "bf16": {"devices": 1, "args": [*EXACT, "runtime.backend=xla", "train.precision=bf16"]},
    "bf16_reference": {"devices": 1, "args": [*EXACT, "runtime.backend=xla", "train.precision=bf16_reference"]},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_workers(SCENARIOS, Path(tmp_path_factory.mktemp("xla_runs")))


def losses(run: dict) -> torch.Tensor:
    return torch.tensor([[r["metrics"][LM], r["metrics"][QH]] for r in run["info"]["records"]])


def metrics(run: dict) -> torch.Tensor:
    return torch.tensor([r["metrics"] for r in run["info"]["records"]])


def assert_params_close(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for name in a:
        diff = (a[name].float() - b[name].float()).abs().max().item()
        assert diff <= atol, f"{name}: max |diff| {diff:.3g} > {atol}"


def test_train_step_on_xla_matches_cpu_eager(runs: dict) -> None:
    cpu, xla = result(runs, "cpu"), result(runs, "xla1")
    assert cpu["info"]["device"] == "cpu" and xla["info"]["device"].startswith("xla")
    assert xla["info"]["backend"] == "xla" and xla["info"]["devices"] == 1
    assert cpu["info"]["loss_divisor"] == xla["info"]["loss_divisor"] == 16
    # Every step's loss sums and metric sums (same init, same batches, the carry across steps).
    torch.testing.assert_close(losses(xla), losses(cpu), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(metrics(xla), metrics(cpu), rtol=1e-4, atol=1e-4)
    # After 4 optimizer steps (Adam-atan2 + SignSGD) the weights still agree.
    assert_params_close(xla["params"], cpu["params"], atol=1e-5)


def test_spmd_over_4_devices_equals_1_device(runs: dict) -> None:
    one, four = result(runs, "xla1"), result(runs, "xla4")
    assert four["info"]["devices"] == 4 and four["info"]["world_size"] == 1
    # The batch is laid out over the mesh's data axis; the carry follows it (sharding propagation).
    assert four["info"]["batch_sharding"] == "{devices=[4,1]0,1,2,3}"
    assert four["info"]["carry_sharding"].startswith("{devices=[4,1,1]")
    # Loss over the global batch, divided by the global batch: the same loss and the same update.
    assert four["info"]["loss_divisor"] == 16
    torch.testing.assert_close(losses(four), losses(one), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(metrics(four), metrics(one), rtol=1e-5, atol=1e-4)
    assert_params_close(four["params"], one["params"], atol=1e-5)


def counter_series(run: dict, name: str) -> list[float]:
    return [r["counters"][name] for r in run["info"]["records"]]


def test_step_compiles_once_and_never_syncs_the_host(runs: dict) -> None:
    run = result(runs, "long")
    compiles = counter_series(run, "UncachedCompile")
    assert 1 <= compiles[WARMUP - 1] <= WARMUP
    flat = compiles[WARMUP - 1 : STAGE_AT]
    assert flat == [flat[0]] * len(flat), (
        f"recompiles after warm-up (lr, exploration and carry change every step): {compiles}"
    )
    assert len(flat) == FLAT + 1
    # Inside the step (train_step + EMA update, before the step boundary) nothing is executed or read back:
    # no .item(), no bool(tensor), no graph cut.
    for record in run["info"]["records"]:
        assert all(v == 0 for v in record["in_step"].values()), (record["step"], record["in_step"])


def test_curriculum_stage_change_costs_exactly_one_compile(runs: dict) -> None:
    run = result(runs, "long")
    compiles = counter_series(run, "UncachedCompile")
    cycles = [tuple(r["cycles"]) for r in run["info"]["records"]]
    assert cycles[STAGE_AT - 1] == (2, 1) and cycles[STAGE_AT] == (1, 2)
    assert compiles[STAGE_AT] == compiles[STAGE_AT - 1] + 1, compiles
    assert compiles[STAGE_AT:] == [compiles[STAGE_AT]] * TAIL, compiles


def test_bf16_autocast_runs_on_the_xla_device(runs: dict) -> None:
    bf16, fp32 = result(runs, "bf16"), result(runs, "xla1")
    assert bf16["info"]["autocast_dtype"] == "torch.bfloat16"  # torch.autocast("xla") is active
    assert fp32["info"]["autocast_dtype"] == "torch.float32"
    got, ref = losses(bf16), losses(fp32)
    assert torch.isfinite(got).all()
    # Same init and batch: the first step's loss agrees to bf16 precision (the loss itself is fp32) ...
    torch.testing.assert_close(got[0], ref[0], rtol=1e-2, atol=1e-3)
    assert not torch.equal(got[0], ref[0])  # ... and is not the fp32 computation
    assert_params_close(bf16["params"], fp32["params"], atol=1e-2)  # finite, and trained as far (4 steps of lr 1.1e-3)


def test_bf16_reference_mode_keeps_the_carry_in_bf16_on_xla(runs: dict) -> None:
    """train.precision=bf16_reference (the TRM reference's forward_dtype): the carry itself is bf16 on the device,
    the step trains as far as fp32 does (4 steps), and it is another computation than autocast's fp32 carry."""
    reference, autocast_run, fp32 = result(runs, "bf16_reference"), result(runs, "bf16"), result(runs, "xla1")
    assert reference["info"]["carry_dtype"] == "torch.bfloat16"
    assert autocast_run["info"]["carry_dtype"] == fp32["info"]["carry_dtype"] == "torch.float32"
    got, ref = losses(reference), losses(fp32)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[0], ref[0], rtol=2e-2, atol=1e-3)
    assert not torch.equal(got, losses(autocast_run))
    assert_params_close(reference["params"], fp32["params"], atol=1e-2)
