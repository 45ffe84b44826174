"""Step speed and utilization: what a job measures (trm/measures/throughput.py), how the dry run uses it
(sweeps/config/estimate.py: `estimate.utilization` per per-chip batch) and what `sweeps.utilization` reads back."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from optuna.trial import FrozenTrial, TrialState

from sweeps.config.estimate import Utilization, UtilizationError
from sweeps.utilization import measured, override
from sweeps.validation.validate import SweepConfigError
from tests.sweep_helpers import sweep_config
from trm.measures.compile_counters import CompileWatch
from trm.measures.throughput import StepTimer


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_step_timer_starts_at_the_first_log_point_and_leaves_evals_out() -> None:
    clock = FakeClock()
    timer = StepTimer(clock, CompileWatch(lambda: {"compiles": 2}))
    clock.now += 30.0  # steps 1-10: compile and warm-up, before the first log point
    timer.mark(10)
    clock.now += 5.0  # steps 11-20
    timer.mark(20)
    with timer.excluded():  # the eval at 20
        clock.now += 7.0
    clock.now += 4.0  # steps 21-30
    timer.mark(30)
    assert (timer.steps, timer.seconds) == (20, 9.0)
    speed = timer.summary(flops_per_sample_step=1000, global_batch=64, devices=4)
    assert speed == {
        "steps": 20,
        "seconds": 9.0,
        "samples_per_s": 64 * 20 / 9.0,
        "flops_per_s": 1000 * 64 * 20 / 9.0,
        "devices": 4,
        "examples_per_device": 16.0,
        "compiles": {
            "at_first_log_point": {"compiles": 2},
            "total": {"compiles": 2},
            "in_timed_steps": {"compiles": 0},
        },
    }


def test_a_step_that_compiles_after_the_first_log_point_is_counted_and_warned() -> None:
    """TorchDynamo's own counters (CPU): a shape change in the timed steps is a recompile the trial stores beside
    its throughput, with a warning line; a compile inside an excluded block (an eval's graph) is not the step's."""
    step = torch.compile(lambda x: x * 2 + 1, backend="eager", dynamic=False)
    timer = StepTimer(FakeClock())
    step(torch.ones(3))  # the first compile, before the first log point
    assert timer.mark(1) is None
    step(torch.ones(3))
    assert timer.mark(2) is None  # the same graph: nothing compiled
    with timer.excluded():
        step(torch.ones(5))  # an eval's shape
    assert timer.mark(3) is None
    step(torch.ones(7))  # the training step's shape changes
    warning = timer.mark(4)
    assert warning is not None and "compiled 1 more time(s) between steps 3 and 4" in warning
    compiles = timer.compiles.summary()
    assert compiles["in_timed_steps"]["compiles"] == 1
    assert compiles["total"]["compiles"] - compiles["at_first_log_point"]["compiles"] == 2  # the eval's included


def test_a_run_with_one_log_point_measures_nothing() -> None:
    clock = FakeClock()
    timer = StepTimer(clock)
    with timer.excluded():  # an eval before any log point is not subtracted from anything
        clock.now += 3.0
    timer.mark(10)
    assert timer.summary(1000, 64, 1) is None


def test_utilization_is_interpolated_in_log_batch_and_held_at_the_ends() -> None:
    util = Utilization.parse({192: 0.4, 24: 0.1})  # any order
    assert util.points == ((24.0, 0.1), (192.0, 0.4))
    assert util.at(24) == 0.1 and util.at(192) == 0.4
    assert util.at(8) == 0.1 and util.at(768) == 0.4  # outside the measured batches: the nearest, no extrapolation
    assert util.at(math.sqrt(24 * 192)) == pytest.approx(0.25)  # the geometric middle: halfway
    single = Utilization.parse(0.3)
    assert single.single and single.at(1) == single.at(10_000) == 0.3
    assert single.describe() == "30%" and util.describe() == "by per-chip batch 24: 10%, 192: 40%"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, "a fraction of the peak must be in (0, 1]"),
        (1.5, "a fraction of the peak must be in (0, 1]"),
        ({24: 0.1, 192: 2}, "=2 at per-chip batch 192: a fraction of the peak must be in (0, 1]"),
        ({0: 0.1}, "per-chip batch 0 must be > 0"),
        ({"many": 0.1}, "'many': 0.1 is not a number pair"),
        ({}, "is empty"),
        ("fast", "expected a fraction of the peak in (0, 1], e.g. 0.3, or one per per-chip batch"),
        (True, "expected a fraction"),
    ],
)
def test_a_bad_utilization_is_one_error_naming_the_key(value: object, expected: str) -> None:
    with pytest.raises(UtilizationError, match=r"estimate\.utilization") as err:
        Utilization.parse(value)
    assert expected in str(err.value)


def test_the_sweep_refuses_a_bad_utilization_before_any_trial(tmp_path: Path) -> None:
    from sweeps.config.typed_config import typed_sweep
    from sweeps.driver import Driver

    cfg = sweep_config(f"sqlite:///{tmp_path}/s.db", tmp_path, "estimate.utilization={24:0.1,192:40}")
    with pytest.raises(SweepConfigError, match=r"estimate\.utilization=40 at per-chip batch 192"):
        Driver(typed_sweep(cfg)).validate()
    cfg = sweep_config(f"sqlite:///{tmp_path}/s.db", tmp_path, "estimate.peak_tflops=0")
    with pytest.raises(SweepConfigError, match=r"estimate\.peak_tflops=0: expected the chip's peak"):
        Driver(typed_sweep(cfg)).validate()
    assert not (tmp_path / "s.db").exists()  # refused before the storage was touched


def _trial(number: int, state: TrialState, speed: dict | None, device: str = "xla:0") -> FrozenTrial:
    attrs = {"device": device, "precision": "bf16", "details": {"throughput": speed} if speed else {}}
    value = 0.5 if state == TrialState.COMPLETE else None
    return FrozenTrial(number, state, value, None, None, {}, {}, attrs, {}, {}, number)


def _speed(flops_per_s: float, devices: int, batch: int) -> dict:
    return {"steps": 90, "seconds": 9.0, "samples_per_s": 10.0 * batch, "flops_per_s": flops_per_s,
            "devices": devices, "examples_per_device": batch / devices}  # fmt: skip


def test_measured_utilization_is_the_median_per_per_chip_batch_of_finished_trials() -> None:
    peak = 100e12
    trials = [
        _trial(0, TrialState.COMPLETE, _speed(32 * 8e12, 32, 768)),  # 8%, 24 examples/chip
        _trial(1, TrialState.PRUNED, _speed(32 * 10e12, 32, 768)),  # 10%
        _trial(2, TrialState.COMPLETE, _speed(32 * 30e12, 32, 768)),  # 30%: the median is 10%
        _trial(3, TrialState.COMPLETE, _speed(4 * 40e12, 4, 768)),  # 40%, 192 examples/chip
        _trial(4, TrialState.FAIL, _speed(4 * 90e12, 4, 768)),  # failed: not counted
        _trial(5, TrialState.COMPLETE, None),  # too short to time
        _trial(6, TrialState.COMPLETE, _speed(2e12, 1, 768), device="cpu"),  # another kind of device
    ]
    rows = measured(trials, peak)
    assert [(r.device, r.examples_per_device, r.trials) for r in rows] == [
        ("cpu", 768.0, [6]),
        ("xla", 24.0, [0, 1, 2]),
        ("xla", 192.0, [3]),
    ]
    xla = [r for r in rows if r.device == "xla"]
    assert xla[0].utilization == pytest.approx(0.10) and xla[0].utilization_range == pytest.approx((0.08, 0.30))
    assert xla[1].utilization == pytest.approx(0.40) and xla[1].devices == 4
    # The override parses back into the same points the dry run prices with.
    text = override(xla)
    assert text == "estimate.utilization={24:0.1,192:0.4}"
    points = dict(item.split(":") for item in text.split("=", 1)[1].strip("{}").split(","))
    assert Utilization.parse(points).points == ((24.0, 0.1), (192.0, 0.4))
