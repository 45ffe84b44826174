"""Failures classified before retrying (issue 45, item 1): an error the job raises before its first step, or the
same error line in two configurations, stops the study at once, spends no retry and ends the driver with the job's
own error line; a retry stays for what a retry can fix (a killed worker, a lost VM, a stall, a driver gone).

The decisions are pure functions (sweeps/trials/outcome.py job_verdict, sweeps/trials/retry.py stop_reason), tested case by case;
two real studies show the whole path: the driver's last line, and how many jobs it launched.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from storage.record import INFEASIBLE_ATTR, JOB_ERROR_ATTR
from sweeps.run import all_failed
from sweeps.trials.outcome import CONFIGURATION_ERRORS, PERMANENT_ERRNOS, job_verdict, raised_line
from sweeps.trials.retry import stop_reason, without_note
from tests.sweep_helpers import FAST_TRIAL, sweep_overrides

NO_GPU = "ValueError: runtime.device=cuda but torch sees no GPU (torch.cuda.is_available() is False)"
CPU_OOM = "RuntimeError: [enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried"
HYDRA_LOG = f"""worker-0 exited with code 1; last log lines:
Error executing job with overrides: ['runtime.device=cuda']
Traceback (most recent call last):
  File "/work/main/trm/runtime/devices.py", line 30, in resolve_device
    raise ValueError(
{NO_GPU}"""


def test_the_classes_a_retry_repeats_are_the_jobs_own() -> None:
    """The driver reads an error the job could not record by its class name: the same classes and errnos the job
    itself does not retry (trm/run_end.py), or the two would disagree on one error."""
    from trm import run_end

    assert set(CONFIGURATION_ERRORS) == {cls.__name__ for cls in run_end.NOT_RETRYABLE}
    assert set(PERMANENT_ERRNOS) == set(run_end.PERMANENT_ERRNOS)


@pytest.mark.parametrize(
    "log, line",
    [
        (HYDRA_LOG, NO_GPU),
        (  # a chained traceback prints its cause first: the error that ended the process is the last
            "KeyError: 'x'\n\nThe above exception was the direct cause of the following exception:\n\n"
            "Traceback (most recent call last):\ntrm.checkpoints.checkpoint.CheckpointError: cannot read latest.pt",
            "trm.checkpoints.checkpoint.CheckpointError: cannot read latest.pt",
        ),
        (  # torchrun's own error about its child is not the job's
            f"{NO_GPU}\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n====\ntrm.train FAILED",
            NO_GPU,
        ),
        ("worker-0 exited with code -9; last log lines:\nstep 10 loss 1.2", None),  # killed: no error of its own
        (None, None),
    ],
    ids=["hydra", "chained", "torchrun", "killed", "no-log"],
)
def test_the_jobs_error_line_is_read_from_its_log(log: str | None, line: str | None) -> None:
    assert raised_line(log) == line


def _verdict(attrs: dict, failure: str | None, cancelled: bool = False):
    return job_verdict(
        attrs, None, "eval/exact_accuracy", exit_code=1, launcher_failure=failure, cancelled=cancelled
    )  # fmt: skip


def test_an_error_raised_before_the_study_was_reached_leads_the_reason_and_is_not_retried() -> None:
    """Issue: `runtime.device=cuda` on a machine without a GPU was queued again twice per configuration, and its
    reason (and the study's summary) began "worker-0 exited with code 1; last log lines:"."""
    verdict = _verdict({}, HYDRA_LOG)
    assert verdict.state == TrialState.FAIL and not verdict.requeue
    assert (verdict.error_line, verdict.before_first_step) == (NO_GPU, True)
    assert verdict.reason.splitlines()[0] == NO_GPU and HYDRA_LOG in verdict.reason  # the log tail still follows

    transient = _verdict({}, "worker-0 exited with code 1; last log lines:\nRuntimeError: rendezvous timed out")
    assert transient.requeue and transient.error_line == "RuntimeError: rendezvous timed out"  # a retry may help
    full = _verdict({}, "worker-0 exited with code 1; last log lines:\nOSError: [Errno 28] No space left on device")
    assert not full.requeue  # ENOSPC: a retry on the same disk meets it again (the job's own rule)
    stopped = _verdict({}, HYDRA_LOG, cancelled=True)  # we stopped it (a stall, Ctrl-C): already handled
    assert stopped.error_line is None and not stopped.requeue


def test_a_killed_worker_is_retried_and_named_without_a_dangling_colon() -> None:
    verdict = _verdict({}, "worker-0 exited with code -9; last log lines:\nstep 10 loss 1.2")
    assert verdict.requeue and verdict.error_line is None
    assert verdict.reason.splitlines()[0] == "worker-0 exited with code -9 without recording an outcome"
    assert verdict.reason.endswith("last log lines:\nstep 10 loss 1.2")


def test_a_recorded_failure_says_whether_it_came_before_the_first_step() -> None:
    setup = _verdict({"outcome": "FAIL", "error": "KeyError: 'arch'", "retryable": False}, None)
    assert (setup.error_line, setup.before_first_step, setup.requeue) == ("KeyError: 'arch'", True, False)
    stepped = {"details": {"timing": {"run_start": 1.0, "first_step_end": 2.0}}}
    later = _verdict({"outcome": "FAIL", "error": "OSError: peer gone", "retryable": True, **stepped}, None)
    assert (later.error_line, later.before_first_step, later.requeue) == ("OSError: peer gone", False, True)


def _failed(number: int, lr: float, line: str | None) -> optuna.trial.FrozenTrial:
    trial = create_trial(
        state=TrialState.FAIL,
        params={"optim.lr": lr},
        distributions={"optim.lr": optuna.distributions.FloatDistribution(1e-4, 1.0)},
        user_attrs={JOB_ERROR_ATTR: line} if line else {},
    )
    trial.number = number
    return trial


LINE = "KeyError: 'eval/exact_accuray'"


@pytest.mark.parametrize(
    "before, retry_helps, line, others, stops",
    [
        (True, False, NO_GPU, [], "before its first step"),  # a config or device check: at once, no retry
        (True, True, "RuntimeError: rendezvous timed out", [], None),  # a lost peer: retried
        (False, False, LINE, [_failed(0, 0.1, LINE)], "trial 0, another configuration, failed with the same error"),
        (False, False, LINE, [_failed(0, 0.2, LINE)], None),  # its own earlier attempt: not another configuration
        (False, False, LINE, [_failed(0, 0.1, "KeyError: 'other'")], None),
        (True, True, "RuntimeError: x", [_failed(0, 0.2, "RuntimeError: x")], "a retry does not get past it"),
        (False, True, "RuntimeError: x", [_failed(0, 0.2, "RuntimeError: x")], None),  # after steps: retried
        (  # divergence belongs to each configuration, even in the same words
            False,
            False,
            "NonFiniteLossError: non-finite loss at step 10: lm_loss=nan",
            [_failed(0, 0.1, "NonFiniteLossError: non-finite loss at step 10: lm_loss=nan")],
            None,
        ),
        (False, True, "torch.OutOfMemoryError: CUDA out of memory", [_failed(0, 0.1, "torch.OutOfMemoryError: CUDA out of memory")], None),
        (True, False, CPU_OOM, [_failed(0, 0.1, CPU_OOM)], None),  # a large model at set-up, on a CPU: its own
    ],
    ids=["setup", "setup-transient", "two-configs", "same-config", "other-error", "retry-repeats", "retry-later",
         "divergence", "oom", "cpu-oom"],
)  # fmt: skip
def test_which_failures_stop_the_study(
    before: bool, retry_helps: bool, line: str, others: list, stops: str | None
) -> None:
    why = stop_reason(line, before, retry_helps, {"optim.lr": 0.2}, others)
    assert why == stops if stops is None else (why is not None and stops in why)


def test_the_summary_names_the_cause_by_its_error_line(tmp_path: Path) -> None:
    """Issue: "all 4 trials failed ...; most often (4x): worker-0 exited with code 1; last log lines:"."""
    study = optuna.create_study(study_name="why", storage=f"sqlite:///{tmp_path}/db.sqlite")
    for _ in range(2):
        trial = study.ask()
        trial.set_user_attr("fail_reason", f"{_verdict({}, HYDRA_LOG).reason}")
        study.tell(trial, state=TrialState.FAIL)
    assert all_failed(study) == f"study 'why': all 2 trials failed; most often (2x): {NO_GPU}"
    assert without_note(f"{NO_GPU}; not queued again: the job raised it before its first step") == NO_GPU


def _study(tmp_path: Path, name: str, *extra: str, trial: list[str] | None = None, env: dict | None = None):
    argv = sweep_overrides(
        f"sqlite:///{tmp_path}/db.sqlite",
        tmp_path / "out",
        "study=halting",
        f"study.name={name}",
        "n_trials=4",
        "pruner=none",
        f"hydra.run.dir={tmp_path}/h",
        *extra,
        trial=trial,
    )
    proc = subprocess.run(
        [sys.executable, "-m", "sweeps.run", *argv],
        capture_output=True,
        text=True,
        timeout=250,
        env={**os.environ, **(env or {})},
    )
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path}/db.sqlite")
    return proc, study.get_trials(deepcopy=False)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_device_check_stops_a_four_trial_study_after_one_job_with_its_own_error(tmp_path: Path) -> None:
    """Issue: 12 jobs (4 trials, each retried twice) and a last line that ended in "last log lines:"."""
    proc, trials = _study(
        tmp_path, "nogpu", trial=[*FAST_TRIAL, "runtime.device=cuda"], env={"CUDA_VISIBLE_DEVICES": ""}
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ValueError: runtime.device=cuda but torch sees no GPU"), last
    assert len(trials) == 1 and trials[0].state == TrialState.FAIL  # one job, no retry queued, nothing drawn
    assert trials[0].user_attrs[JOB_ERROR_ATTR] == last.removeprefix("error: ")
    assert "not queued again: the job raised it before its first step" in trials[0].user_attrs["fail_reason"]
    assert len(list((tmp_path / "out").glob("nogpu/*/trial-*"))) == 1


FAKE_INTERPRETER = """#!/bin/sh
# A machine whose training jobs all fail on the same error, a class a retry could get past (RuntimeError).
if [ "$1 $2" = "-m trm.train" ]; then
  echo "Traceback (most recent call last):"
  echo "RuntimeError: the accelerator runtime is not installed"
  exit 1
fi
exec {python} "$@"
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_same_error_in_two_configurations_stops_the_study(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text(FAKE_INTERPRETER.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    proc, trials = _study(tmp_path, "same", "heartbeat.max_retry=0", f"launcher.python={fake}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == "error: RuntimeError: the accelerator runtime is not installed"
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.FAIL]  # two configurations, then none
    assert trials[0].params != trials[1].params
    assert "trial 0, another configuration, failed with the same error" in trials[1].user_attrs["fail_reason"]


CAPPED_INTERPRETER = """#!/bin/sh
# A machine with 3 GB of address space per training job: a model too large for it runs out of memory.
ulimit -v 3000000
exec {python} "$@"
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_out_of_memory_trial_is_infeasible_not_retried_and_the_study_goes_on(tmp_path: Path) -> None:
    """A 16384-wide model cannot be built under the cap (its set-up fails, as a device check would): it was retried,
    and its error before the first step would have stopped the study. It is the configuration's own fault."""
    from sweeps.config.typed_config import typed_sweep
    from sweeps.driver import Driver
    from tests.sweep_helpers import sweep_config
    from tests.test_sweeps import with_space

    capped = tmp_path / "python"
    capped.write_text(CAPPED_INTERPRETER.format(python=sys.executable))
    capped.chmod(capped.stat().st_mode | stat.S_IXUSR)
    db = f"sqlite:///{tmp_path}/db.sqlite"
    cfg = sweep_config(
        db, tmp_path / "out", "study=halting", "study.name=oom", "n_trials=2", "pruner=none", "sampler=grid",
        "study.enqueue_baseline=false", f"launcher.python={capped}", "reeval.at_end=false",
    )  # fmt: skip
    Driver(typed_sweep(with_space(cfg, {"arch.hidden_size": "choice(16, 16384)"}))).run()
    trials = optuna.load_study(study_name="oom", storage=db).get_trials(deepcopy=False)
    by_width = {t.params["arch.hidden_size"]: t for t in trials}
    assert len(trials) == 2 and set(by_width) == {16, 16384}  # no retry queued, nothing else drawn
    large = by_width[16384]
    assert large.state == TrialState.FAIL and large.user_attrs[INFEASIBLE_ATTR] == "out of memory"
    assert large.user_attrs["retryable"] is False
    assert large.user_attrs["fail_reason"].startswith("infeasible (out of memory"), large.user_attrs["fail_reason"]
    assert "can't allocate memory" in large.user_attrs[JOB_ERROR_ATTR]
    # Issue 57.3: its peak was unset (the status table's column empty) where the set-up ran out; now it is stored.
    peak = large.user_attrs["peak_memory_mb"]
    assert isinstance(peak, float) and peak > 0 and f"peak {peak:.0f} MiB" in large.user_attrs["fail_reason"]
    assert by_width[16].state == TrialState.COMPLETE  # the study went on: a smaller configuration fits
