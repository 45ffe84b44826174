"""What each fault did and what recovered it, the invariants' verdicts, as one result and a markdown table; the
end of every driver's log for a failed invariant."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from sweeps.search.space import params_to_values
from tests.chaos.faults import FAULT_KINDS, Fault
from tests.chaos.injector import DriverRun, Soaked
from tests.chaos.invariants import Check
from tests.chaos.record import StudyRecord, resumed_from


def trial_row(t: Any, chain: dict[int, list[int]]) -> dict[str, Any]:
    return {
        "number": t.number,
        "state": t.state.name,
        "value": t.value if t.state.name == "COMPLETE" else None,
        "params": params_to_values(t.params),
        "chain": chain[t.number],
        "duplicate_of": t.user_attrs.get("duplicate_of"),
        "fail_reason": next(iter(str(t.user_attrs.get("fail_reason") or "").splitlines()), "") or None,
        "started": t.datetime_start.timestamp() if t.datetime_start else None,
        "completed": t.datetime_complete.timestamp() if t.datetime_complete else None,
    }


def fate(n: int, by_number: dict[int, Any], chain: dict[int, list[int]], since: float | None) -> str:
    """What became of trial n: its state and reason, then its retry (the chain's last attempt) and where it resumed."""
    t = by_number.get(n)
    if t is None:
        return f"trial {n}: not in the study"
    words = f"trial {n} {t.state.name}"
    if t.state.name == "FAIL":
        words += f" ({next(iter(str(t.user_attrs.get('fail_reason') or '').splitlines()), '')[:90]})"
    later = [m for m in chain.get(n, []) if m > n]
    if later:
        last = by_number[later[-1]]
        start = resumed_from(Path(str(last.user_attrs.get("workdir"))))
        words += f" -> retry trial {last.number} {last.state.name}"
        if len(later) > 1:
            words += f" (after {len(later) - 1} more attempt(s))"
        if start is not None:
            words += f", resumed from step {start}"
        if since is not None and last.datetime_complete is not None:
            words += f", {last.datetime_complete.timestamp() - since:.0f} s after the fault"
    return words


def recoveries(
    faults: list[Fault], by_number: dict[int, Any], chain: dict[int, list[int]], t0: float
) -> list[dict[str, Any]]:
    rows = []
    for i, f in enumerate(faults):
        if not f.injected:
            rows.append(
                {
                    "fault": i + 1,
                    "kind": f.kind,
                    "at_s": None,
                    "what": f"{f.kind}: not injected ({f.note})",
                    "recovery": "-",
                }
            )
            continue
        since = t0 + (f.at_s or 0.0)
        if f.kind in ("kill_job", "stop_job"):
            verb = "SIGKILL" if f.kind == "kill_job" else "SIGSTOP"
            what = f"{verb} job of trial {f.trial} at step {f.step} (pid {f.pid})"
            recovery = fate(f.trial, by_number, chain, since)
            if f.kind == "stop_job":
                recovery += "; stopped process " + (
                    f"gone {f.gone_after_s} s after SIGSTOP"
                    if f.gone_after_s is not None
                    else "NOT stopped by the driver"
                )
        elif f.kind == "kill_driver":
            what = f"SIGKILL {f.driver} (pid {f.pid}) running trial(s) {f.trials}; restarted as pid {f.restarted_pid}"
            told = [n for n in f.trials if n in by_number and by_number[n].state.name in ("COMPLETE", "PRUNED")]
            recovery = (
                "; ".join(
                    fate(n, by_number, chain, since) + (" (the outcome its orphaned job stored)" if n in told else "")
                    for n in f.trials
                )
                or "no trial of its own running"
            )
        else:
            what = f"PostgreSQL restart ({f.note}) with trial(s) {f.trials} running"
            recovery = "; ".join(fate(n, by_number, chain, since) for n in f.trials)
        rows.append({"fault": i + 1, "kind": f.kind, "at_s": f.at_s, "what": what, "recovery": recovery})
    return rows


def markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    counts = result["fault_counts"]
    lines = [
        f"Soak: {s['n_trials']} trials, {s['drivers']} drivers x {s['max_concurrent']}, study=halting objective={s['objective']} pruner={s['pruner']}, "
        f"{s['train_steps']}-step trials, stall_timeout_s={s['stall_timeout_s']}, heartbeat {s['heartbeat_interval_s']} s / "
        f"grace {s['grace_s']} s, seed {s['seed']}; {result['wall_s']:.0f} s wall; faults injected: "
        + ", ".join(f"{k} {v}" for k, v in counts.items()),
        "",
        "| # | at (s) | fault | what the record says, and the recovery |",
        "| --- | --- | --- | --- |",
    ]
    for r in result["recoveries"]:
        at = "-" if r.get("at_s") is None else f"{r['at_s']:.0f}"
        lines.append(f"| {r['fault']} | {at} | {r['what']} | {r['recovery']} |")
    lines += ["", "| check | ok | detail |", "| --- | --- | --- |"]
    for c in result["checks"]:
        lines.append(f"| {c['check']} | {'yes' if c['ok'] else '**NO**'} | {c['detail']} |")
    lines += ["", f"**{'PASS' if result['ok'] else 'FAIL'}**"]
    return "\n".join(lines)


def log_tails(runs: list[DriverRun], lines: int = 25) -> str:
    """The end of every driver's log (heartbeat and progress chatter left out): what a failed check needs first."""
    noise = ("heartbeat for trial", "no eval yet", ": step ")
    out = []
    for run in runs:
        try:
            kept = [
                line
                for line in run.log.read_text(errors="replace").splitlines()
                if line.strip() and not any(n in line for n in noise)
            ]
        except OSError as err:
            kept = [f"(unreadable: {err})"]
        out.append(f"--- {run.name} ({run.log})\n" + "\n".join(kept[-lines:]))
    return "\n".join(out)


def summarize(soaked: Soaked, record: StudyRecord, checks: list[Check]) -> dict[str, Any]:
    """Everything about one faulted study: settings, faults, drivers, trials, recoveries, checks, and the table."""
    out: dict[str, Any] = {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(soaked.settings).items()},
        "storage": soaked.url,
        "wall_s": soaked.wall_s,
        "fault_counts": fault_counts(soaked.faults),
        "faults": [asdict(f) for f in soaked.faults],
        "drivers": [
            {
                "name": r.name,
                "pid": r.proc.pid,
                "killed": r.killed,
                "returncode": r.returncode,
                "started_s": r.started_s,
                "ended_s": r.ended_s,
                "log": str(r.log),
            }
            for r in soaked.runs
        ],
        "leftover_jobs": soaked.leftover_jobs,
        "checks": [{"check": c.name, "ok": c.ok, "detail": c.detail} for c in checks],
        "recoveries": recoveries(soaked.faults, record.by_number, record.chain, soaked.t0),
        "trials": [trial_row(t, record.chain) for t in record.trials],
        "ok": all(c.ok for c in checks),
    }
    out["table"] = markdown(out)
    return out


def fault_counts(faults: list[Fault]) -> dict[str, int]:
    """How many faults of each kind were injected."""
    return {kind: sum(1 for f in faults if f.kind == kind and f.injected) for kind in FAULT_KINDS}
