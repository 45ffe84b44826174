"""`python -m sweeps.status [study=NAME] [format=table|json|csv] [storage.url=...]`: studies and their trials.

Needs nothing but the storage: works for a study written from another machine. `format=csv` is one row per
trial (a spreadsheet's or pandas' input, without pandas: `pip install trm-sweeps[pandas]` for Optuna's own
`study.trials_dataframe()`).
"""

from __future__ import annotations

import csv
import io
import json
import sys
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from storage import redact
from storage.cli import STORAGE_KEYS, ArgumentError, parse_args, run_cli, storage_from_args
from storage.record import FAIL_REASON_ATTR, trained_trials
from storage.study_record import StudyAttrs
from storage.trial_record import TrialOutcome
from sweeps.search.space import params_to_values
from sweeps.trials.confirmed import confirmed_lines, confirmed_rows
from sweeps.trials.outcome import clip_line

FORMATS = ("table", "json", "csv")


def trial_row(trial: FrozenTrial) -> dict[str, Any]:
    duration = (
        (trial.datetime_complete - trial.datetime_start).total_seconds()
        if trial.datetime_complete and trial.datetime_start
        else None
    )
    record = TrialOutcome.of(trial.user_attrs)
    return {
        "number": trial.number,
        "state": trial.state.name,
        "value": trial.values if trial.values and len(trial.values) > 1 else trial.value,
        "params": params_to_values(trial.params),
        "duration_s": round(duration, 1) if duration is not None else None,
        "best_step": record.best_step,
        "steps": record.steps,
        "peak_memory_mb": record.peak_memory_mb,
        "reason": clip_line(next(iter((trial.user_attrs.get(FAIL_REASON_ATTR) or "").splitlines()), ""), 120) or None,
    }


def confirmed_cells(row: dict[str, Any] | None) -> dict[str, Any]:
    """A trial's confirmed mean over seeds and its standard error (eval + seed, or eval: `confirmed_se_kind`), beside
    its own value; None where its configuration was not confirmed."""
    return {
        "confirmed_mean": row["mean"] if row else None,
        "confirmed_se": row["se"] if row else None,
        "confirmed_se_kind": row["se_kind"] if row else None,
    }


def collect(storage: optuna.storages.BaseStorage, study_name: str | None) -> list[dict[str, Any]]:
    names = (
        [study_name]
        if study_name
        else [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
    )
    studies = []
    for name in names:
        study = optuna.load_study(study_name=name, storage=storage)
        trials = trained_trials(study.get_trials(deepcopy=False))  # refused repeats, trials never started: not shown
        counts = {
            state: sum(t.state.name == state for t in trials)
            for state in ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")
        }
        best = None
        if len(study.directions) == 1 and counts["COMPLETE"]:
            best = {"number": study.best_trial.number, "value": study.best_value}
        confirmed = confirmed_rows(study)  # the top configurations on fresh seeds (sweeps/trials/confirm.py)
        by_trial = {row["trial"]: row for row in confirmed}
        studies.append(
            {
                "study": name,
                "directions": [d.name.lower() for d in study.directions],
                "objective": StudyAttrs.of(study.user_attrs).objective,
                "counts": counts,
                "best": best,
                "confirmed": confirmed,
                "confirmed_lines": confirmed_lines(study) if confirmed else [],
                "trials": [trial_row(t) | confirmed_cells(by_trial.get(t.number)) for t in trials],
            }
        )
    return studies


def render_table(studies: list[dict[str, Any]]) -> str:
    lines = []
    for s in studies:
        counts = ", ".join(f"{k.lower()} {v}" for k, v in s["counts"].items() if v)
        best = f"; best trial {s['best']['number']} = {s['best']['value']:.4f}" if s["best"] else ""
        lines.append(
            f"study {s['study']} ({s['objective']}, {'/'.join(s['directions'])}): {counts or 'no trials'}{best}"
        )
        confirmed = bool(s["confirmed"])
        head = f" {'confirmed':>15}" if confirmed else ""
        lines.append(
            f"  {'#':>4} {'state':<9} {'value':>10}{head} {'best step':>9} {'dur s':>7} {'peak MiB':>8}  params"
        )
        for t in s["trials"]:
            value = t["value"]
            shown = (
                ""
                if value is None
                else (",".join(f"{v:.4g}" for v in value) if isinstance(value, list) else f"{value:.4f}")
            )
            params = " ".join(f"{k}={v}" for k, v in t["params"].items())
            extra = f"  ({t['reason']})" if t["reason"] else ""
            mean, spread = t["confirmed_mean"], t["confirmed_se"]
            confirmed_text = f"{mean:.4f}±{spread:.4f}" if mean is not None else ""
            cell = f" {confirmed_text:>15}" if confirmed else ""
            lines.append(
                f"  {t['number']:>4} {t['state']:<9} {shown:>10}{cell} {str(t['best_step'] or ''):>9} {str(t['duration_s'] or ''):>7} "
                f"{str(t['peak_memory_mb'] or ''):>8}  {params}{extra}"
            )
        lines += [f"  {line}" for line in s["confirmed_lines"]]
    return "\n".join(lines)


def render_csv(studies: list[dict[str, Any]]) -> str:
    """One row per trial; each parameter its own column under its plain override name (empty where a trial
    did not sample it: a conditional parameter of another branch)."""
    params = list(dict.fromkeys(key for s in studies for t in s["trials"] for key in t["params"]))
    columns = [
        "study",
        "number",
        "state",
        "value",
        "duration_s",
        "best_step",
        "steps",
        "peak_memory_mb",
        "reason",
        "confirmed_mean",
        "confirmed_se",
        "confirmed_se_kind",
        *params,
    ]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for s in studies:
        for t in s["trials"]:
            value = t["value"]
            row = {**{k: t[k] for k in columns[1:12]}, "study": s["study"], **t["params"]}
            row["value"] = ";".join(map(str, value)) if isinstance(value, list) else value
            writer.writerow(row)
    return out.getvalue().rstrip("\n")


def main(argv: list[str] | None = None) -> int:
    return run_cli(status, argv)


def status(argv: list[str]) -> int:
    args = parse_args(argv, {"study": None, "format": "table", **STORAGE_KEYS}, (__doc__ or "").strip())
    fmt = args["format"]
    if fmt not in FORMATS:
        raise ArgumentError(f"format={fmt!r}: expected one of {list(FORMATS)}")
    # A reader creates nothing: a mistyped path is an error, not a new empty database (nor its directory).
    url, storage = storage_from_args(args)
    try:
        studies = collect(storage, args.get("study"))
    except KeyError:
        raise ArgumentError(f"study={args.get('study')!r} not found in {redact(url)}") from None
    renders = {
        "json": lambda: json.dumps(studies, default=str),
        "csv": lambda: render_csv(studies),
        "table": lambda: render_table(studies),
    }
    print(renders[fmt]())
    return 0


if __name__ == "__main__":
    sys.exit(main())
