"""What the pod soak's study must end with (issue 56, Done when), each a `Check` over the study's record: every
configuration trained, no retry spent on an infrastructure fault, no orphan process, no checkpoint lost beyond one
interval; and that the driver ended and every fault was injected. docs/reliability.md (Pod soak) says them in words."""

from __future__ import annotations

import os
from pathlib import Path

from optuna.trial import TrialState

from storage.record import PREEMPTED_ATTR, PROGRESS_ATTR, RETRIES_NOT_SPENT_ATTR
from sweeps.trials.retry import retries_used
from tests.chaos.invariants import SETTLED, Check
from tests.chaos.pod_faults import PodFault
from tests.chaos.record import FINISHED, StudyRecord, first_line, reason, resumed_from


def driver_ended(returncode: int | None, timeout_s: float) -> Check:
    """The driver ran the study to its end and exited 0."""
    if returncode is None:
        return Check("driver ended", [f"driver still running after {timeout_s:g} s (stopped)"], "")
    return Check("driver ended", [] if returncode == 0 else [f"driver exited {returncode}"], "driver exited 0")


def pod_faults_injected(faults: list[PodFault]) -> Check:
    """Every scheduled fault was injected (and healed) before the study ended."""
    missed = [f"{f.kind} at {f.at_s:.0f} s: {f.note}" for f in faults if f.injected_at_s is None]
    done = [f"{f.kind} at {f.injected_at_s:.0f} s" for f in faults if f.injected_at_s is not None]
    return Check("faults injected", missed, ", ".join(done) or "none scheduled")


def every_configuration_trained(record: StudyRecord) -> Check:
    """Every trial finished; every retry chain ends COMPLETE or PRUNED (by the pruner); the only FAILs are
    attempts set aside for the machine (a preempted mark) that a later attempt of the same chain continued."""
    problems = [f"trial {t.number} {t.state.name}" for t in record.trials if t.state not in FINISHED]
    for t in record.trials:
        chain = record.chain[t.number]
        last = record.by_number[chain[-1]]
        if t.number == chain[0] and last.state not in SETTLED:
            problems.append(f"chain {chain} ends {last.state.name}: {first_line(reason(last))!r}")
        if t.state == TrialState.FAIL and not (t.user_attrs.get(PREEMPTED_ATTR) and t.number != chain[-1]):
            problems.append(f"trial {t.number} FAIL, not set aside for the machine: {first_line(reason(t))!r}")
    settled = [record.by_number[c[-1]] for n, c in record.chain.items() if n == c[0]]
    complete = sum(t.state == TrialState.COMPLETE for t in settled)
    if not complete:
        problems.append("no configuration COMPLETE")
    return Check(
        "every configuration trained",
        problems,
        f"{len(settled)} configurations: {complete} COMPLETE, {len(settled) - complete} PRUNED; "
        f"{sum(t.state == TrialState.FAIL for t in record.trials)} attempts set aside for the machine",
    )


def no_retry_on_infrastructure(record: StudyRecord) -> Check:
    """No chain spent a retry of heartbeat.max_retry (the soak injects infrastructure faults only), and each
    attempt after one set aside for the machine carries that as a retry not spent."""
    spent = [f"trial {t.number}: {retries_used(t)} retry(ies) spent" for t in record.trials if retries_used(t)]
    # Set aside: FAIL with the mark (a queued copy inherits its attributes, the mark among them, until it runs).
    aside = [t for t in record.trials if t.state == TrialState.FAIL and t.user_attrs.get(PREEMPTED_ATTR)]
    for t in aside:
        chain = record.chain[t.number]
        later = [record.by_number[n] for n in chain if n > t.number]
        if later and not int(later[0].user_attrs.get(RETRIES_NOT_SPENT_ATTR) or 0):
            spent.append(f"trial {later[0].number} continues {t.number} (set aside) with no retry marked not spent")
    return Check("no retry on infrastructure", spent, f"{len(aside)} attempts set aside, 0 retries spent")


def no_checkpoint_lost(record: StudyRecord, eval_interval: int) -> Check:
    """An attempt that continues others resumed at or after their last periodic save (a save at each eval, every
    `eval_interval` steps): the furthest step an earlier attempt of its chain reported (its progress), rounded
    down to a save. An attempt that never started training (no start event: set aside in its start-up, or still
    queued, which every_configuration_trained reports) resumed nothing."""
    lost, resumed = [], []
    for t in record.trials:
        chain = record.chain[t.number]
        start = resumed_from(Path(str(t.user_attrs.get("workdir") or "")))
        if t.number == chain[0] or start is None:
            continue
        earlier = [record.by_number[n] for n in chain[: chain.index(t.number)]]
        reached = max(int((e.user_attrs.get(PROGRESS_ATTR) or {}).get("step") or 0) for e in earlier)
        saved = reached // eval_interval * eval_interval
        resumed.append(f"{chain[0]}->{t.number}: reached {reached}, resumed {start}")
        if start < saved:
            lost.append(f"trial {t.number} resumed from {start}, its chain {chain} had saved step {saved}")
    return Check("no checkpoint lost", lost, "; ".join(resumed) or "no attempt continued another")


def soak_processes(markers: list[str], home_prefix: str) -> list[dict[str, object]]:
    """Live processes of the soak (not this one): a command line naming one of `markers` (the slice, the work
    directory), or a HOME under `home_prefix` (a stand-in VM's process)."""
    found, mine = [], ancestors()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").replace("\0", " ")
            stat = Path(f"/proc/{entry}/stat").read_text()
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if stat[stat.rfind(")") + 2] in ("Z", "X"):
            continue
        home = next((e[5:].decode(errors="replace") for e in env if e.startswith(b"HOME=")), "")
        if any(m in argv for m in markers) or home.startswith(home_prefix):
            found.append({"pid": int(entry), "cmdline": argv[:200], "home": home})
    return found


def ancestors() -> set[int]:
    """This process and the ones that started it (the soak's own command line names the work directory)."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat[stat.rfind(")") + 2 :].split()[1])
    return pids


def no_orphan_process(leftover: list[dict[str, object]]) -> Check:
    """No process of the soak's driver or of its VMs is alive once the driver has exited."""
    return Check(
        "no orphan process",
        [f"pid {p['pid']} {p['cmdline']!r}" for p in leftover],
        "no process of the driver, its gcloud calls or the VMs left after the driver",
    )
