"""The kernel's OOM killer (issue 57.2): in a memory cgroup a configuration too wide for the machine was launched 3
times (three kernel kills), its reason `worker-0 exited with code -9 without recording an outcome` and nothing after
it, not infeasible, no peak. Its job now samples its memory onto its trial from before its set-up
(trm/measures/memory_watch.py); the driver, seeing it killed by SIGKILL, reads its memory cgroup's OOM kill count again
(contracts/out_of_memory.py): risen, the trial is infeasible with its peak, launched once, and the study goes on.

The study test runs its jobs in a memory cgroup of their own (cgroup v1's memory hierarchy, or v2 where this
process may create one): it is skipped where the machine does not let the test create one."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from contracts.out_of_memory import killed_for_memory, memory_cgroup, oom_kills, out_of_memory
from storage.record import INFEASIBLE_ATTR, JOB_ERROR_ATTR, MEMORY_ATTR
from storage.trial_record import TrialOutcome
from sweeps.trials.outcome import job_verdict
from sweeps.trials.retry import stop_reason

KILLED = "worker-0 exited with code -9; last log lines:\nbuilding the model"


def test_a_sigkill_is_the_oom_killer_only_with_its_evidence() -> None:
    # The cgroup's count rose: the OOM killer, whatever the peak sampled before it.
    line = killed_for_memory(True, 450.0, 1200.0, 0, 1)
    assert line == (
        "out of memory: the kernel's OOM killer ended the job (SIGKILL; its memory cgroup's oom_kill count rose from 0 "
        "to 1), peak 450 MiB sampled of a 1200 MiB limit"
    )
    assert out_of_memory(line) and stop_reason(line, True, False, {}, []) is None  # the study goes on
    # No count to read (a pod's VM): its last peak at its limit.
    assert killed_for_memory(True, 1150.0, 1200.0, None, None) == (
        "out of memory: the job was killed by SIGKILL at its memory limit, peak 1150 MiB sampled of a 1200 MiB limit"
    )
    assert killed_for_memory(True, 450.0, 1200.0, 1, 1) is None  # a kill -9, not the kernel's: worth a retry
    assert killed_for_memory(True, 450.0, 1200.0, None, None) is None
    assert killed_for_memory(False, 1190.0, 1200.0, 0, 1) is None  # an exit of its own


def test_a_job_the_oom_killer_ended_is_infeasible_with_its_peak_and_not_retried() -> None:
    attrs = {MEMORY_ATTR: {"peak_mb": 450.0, "at": 1.0, "limit_mb": 1200.0, "oom_kills": 0}}
    line = killed_for_memory(True, 450.0, 1200.0, 0, 1)
    verdict = job_verdict(
        attrs, None, "eval/exact_accuracy", exit_code=-9, launcher_failure=KILLED, cancelled=False, memory_killed=line
    )
    assert verdict.state == TrialState.FAIL and not verdict.requeue
    assert (verdict.infeasible, verdict.peak_memory_mb, verdict.error_line) == ("out of memory", 450.0, line)
    assert verdict.reason.splitlines()[0] == f"infeasible (out of memory, peak 450 MiB), not retried: {line}"
    assert verdict.reason.endswith(KILLED)
    plain = job_verdict(attrs, None, "eval/exact_accuracy", exit_code=-9, launcher_failure=KILLED, cancelled=False)
    assert plain.requeue and plain.infeasible is None  # no evidence: a killed worker, retried as before


def test_a_memory_cgroup_is_found_in_v1_and_v2_layouts(tmp_path: Path) -> None:
    proc, sys_root = tmp_path / "proc", tmp_path / "sys"
    proc.mkdir()
    v1 = sys_root / "memory" / "jobs" / "a"
    v1.mkdir(parents=True)
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    (v1 / "memory.limit_in_bytes").write_text(f"{1200 * 2**20}\n")
    (proc / "cgroup").write_text("5:cpu:/\n4:memory:/jobs/a\n0::/\n")
    found = memory_cgroup(proc, sys_root)
    assert found is not None and found.events == v1 / "memory.oom_control" and found.limit_mb == 1200.0
    assert oom_kills(found.events) == 3
    v2 = sys_root / "jobs" / "b"
    v2.mkdir(parents=True)
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\n")
    (v2 / "memory.max").write_text("max\n")
    (proc / "cgroup").write_text("0::/jobs/b\n")
    found = memory_cgroup(proc, sys_root)
    assert found is not None and found.events == v2 / "memory.events" and found.limit_mb is None  # no limit set
    assert oom_kills(found.events) == 2
    (proc / "cgroup").write_text("0::/nowhere\n")
    assert memory_cgroup(proc, sys_root) is None


def _own_memory_cgroup() -> Path | None:
    """The memory cgroup directory this process is in, where a child may be created (v1's memory hierarchy, or v2)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
        if controllers == "" and (Path("/sys/fs/cgroup") / path.lstrip("/") / "cgroup.subtree_control").exists():
            return Path("/sys/fs/cgroup") / path.lstrip("/")
    return None


@pytest.fixture
def memory_limited(tmp_path: Path) -> Iterator[Path]:
    """A memory cgroup with a 1200 MiB limit and no swap, created for the test (skipped where that is refused)."""
    parent = _own_memory_cgroup()
    if parent is None:
        pytest.skip("no memory cgroup of this process to create one under")
    cgroup = parent / f"trm-oom-test-{os.getpid()}"
    try:
        cgroup.mkdir()
        limit = str(1200 * 2**20)
        v1 = (cgroup / "memory.limit_in_bytes").exists()
        (cgroup / ("memory.limit_in_bytes" if v1 else "memory.max")).write_text(limit)
        if (cgroup / "memory.swap.max").exists():
            (cgroup / "memory.swap.max").write_text("0")
    except OSError as err:
        if cgroup.exists():
            cgroup.rmdir()
        pytest.skip(f"cannot create a memory cgroup here: {err}")
    try:
        yield cgroup
    finally:
        cgroup.rmdir()  # its processes are gone: every job of the study ended


def _kills(cgroup: Path) -> int | None:
    v1 = cgroup / "memory.oom_control"
    return oom_kills(v1 if v1.exists() else cgroup / "memory.events")


JOINING_INTERPRETER = """#!/bin/sh
# Every job of the study runs in the test's memory cgroup (a machine with 1200 MiB for its jobs).
echo $$ > {cgroup}/cgroup.procs
exec {python} "$@"
"""


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_configuration_the_oom_killer_ends_is_launched_once_infeasible_with_its_peak(
    tmp_path: Path, memory_limited: Path
) -> None:
    """Done when (issue 57): a configuration too wide to fit in a memory cgroup is launched once, marked infeasible
    with its peak, and the study goes on."""
    from sweeps.config.typed_config import typed_sweep
    from sweeps.driver import Driver
    from tests.sweep_helpers import sweep_config
    from tests.test_sweeps import with_space

    joining = tmp_path / "python"
    joining.write_text(JOINING_INTERPRETER.format(cgroup=memory_limited, python=sys.executable))
    joining.chmod(joining.stat().st_mode | stat.S_IXUSR)
    kills = _kills(memory_limited)
    db = f"sqlite:///{tmp_path}/db.sqlite"
    cfg = sweep_config(
        db, tmp_path / "out", "study=halting", "study.name=oomkill", "n_trials=2", "pruner=none", "sampler=grid",
        "study.enqueue_baseline=false", f"launcher.python={joining}", "heartbeat.max_retry=2",
    )  # fmt: skip
    Driver(typed_sweep(with_space(cfg, {"arch.hidden_size": "choice(16, 16384)"}))).run()
    trials = optuna.load_study(study_name="oomkill", storage=db).get_trials(deepcopy=False)
    by_width = {t.params["arch.hidden_size"]: t for t in trials}
    assert len(trials) == 2 and set(by_width) == {16, 16384}, [(t.number, t.state) for t in trials]  # launched once
    large = by_width[16384]
    reason = large.user_attrs["fail_reason"]
    print(f"[fault] OOM killer: {reason.splitlines()[0]}")
    assert large.state == TrialState.FAIL and large.user_attrs[INFEASIBLE_ATTR] == "out of memory", reason
    assert reason.startswith("infeasible (out of memory, peak "), reason
    assert large.user_attrs[JOB_ERROR_ATTR].startswith("out of memory: the kernel's OOM killer ended the job")
    peak = TrialOutcome.of(large.user_attrs).peak_memory_mb
    # The job's own sample before the kill: its resident set, which counts shared libraries the cgroup charges
    # elsewhere, so it may read above the cgroup's limit.
    assert isinstance(peak, float) and peak > 0 and f"peak {peak:.0f} MiB" in reason
    assert large.user_attrs[MEMORY_ATTR]["limit_mb"] == 1200.0
    assert by_width[16].state == TrialState.COMPLETE  # the study went on: a smaller configuration fits
    assert kills is not None and _kills(memory_limited) == kills + 1  # one kernel kill: not retried
