"""`python -m dashboards.report study=NAME[,NAME...] [chips=N] [storage.url=...] [storage.password_env=NAME] [out=FILE.html]`

One self-contained HTML file (plotly.js inlined once; opens offline, can be mailed or archived). For one study:
its best trial as plain overrides with the re-train command, best checkpoint, W&B run and code version; Optuna's
views (optimization history, parameter importances once enough trials completed, parallel coordinates, the
Pareto front of multi-objective studies); per-trial curves (the reported metric and, where the trials' metrics
files are readable here, every logged train/eval metric) against training step, wall-clock seconds or
chip-hours; slices one parameter per subplot; accuracy vs parameter count and vs training compute with their
Pareto fronts, accuracy by optimizer, the effect of curriculum and halting settings, the seed spread of
replicated configurations; and a table of every trial with its durations and links. A figure that does not
apply is left out with a one-line note saying why.

`study=a,b` compares studies on one page: a side-by-side summary, each study's best value so far against trial
number, hours or chip-hours, then each study's own report. `chips=N`: the chips one trial trains on, for the
chip-hour axes (default: the chips its slot gave the trial, TrialLaunch.chips, where the launcher counts them).

Every figure is a `<div id="fig-...">` (the ids in FIGURES; `s1-fig-...`, `s2-fig-...` when comparing). Needs
nothing but the storage (and, for the curves beyond the reported metric, the trials' metrics files where this
machine has them): works for a study written from another machine.

Modules: report_view (a study as the figures see it), report_optuna, report_curves, report_project (figures),
report_tables (best trial, trials), report_compare (several studies), report_page (the HTML).
"""

from __future__ import annotations

import sys
from pathlib import Path

import optuna
from plotly.offline import get_plotlyjs

from dashboards.report_page import FIGURES, build_sections, render_html, write_report
from dashboards.report_view import Section, StudyView
from storage import redact
from storage.cli import (
    STORAGE_KEYS,
    ArgumentError,
    parse_args,
    run_cli,
    storage_from_args,
)
from storage.study_name import SEPARATOR, file_stem

__all__ = [
    "FIGURES",
    "Section",
    "StudyView",
    "build_sections",
    "get_plotlyjs",
    "main",
    "render_html",
    "report",
    "write_report",
]
KNOWN: dict[str, str | None] = {"study": None, "out": None, "chips": None, **STORAGE_KEYS}
REPORTS = Path("outputs/reports")  # where a report goes unless out= names a file


def study_names(value: str, known: list[str] | None = None) -> list[str]:
    """`a,b` -> ["a", "b"]: the studies to report, in order, each once. A study whose whole name is `value` (one
    with a comma or spaces, created outside sweeps.run, which refuses them) is that one study; `known` holds the
    storage's study names."""
    if known is not None and value in known:
        parts = [n.strip() for n in value.split(SEPARATOR)]
        if len(parts) > 1 and all(p in known for p in parts):
            raise ArgumentError(f"study={value!r} names a study and also the studies {parts}: rename one of them")
        return [value]
    names = list(dict.fromkeys(n.strip() for n in value.split(SEPARATOR) if n.strip()))
    if not names:
        raise ArgumentError("study=NAME is required (python -m sweeps.status lists the studies)")
    return names


def parse_chips(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        chips = int(value)
    except ValueError:
        chips = 0
    if chips <= 0:
        raise ArgumentError(f"chips={value!r}: expected a positive whole number (the chips one trial trains on)")
    return chips


def main(argv: list[str] | None = None) -> int:
    return run_cli(report, argv)


def report(argv: list[str]) -> int:
    args = parse_args(argv, KNOWN, (__doc__ or "").strip())
    study_names(args.get("study") or "")  # a missing study= is an error before the storage is opened
    chips = parse_chips(args.get("chips"))
    url, storage = storage_from_args(args)
    names = study_names(args["study"], [s.study_name for s in storage.get_all_studies()])
    studies = []
    for name in names:
        try:
            studies.append(optuna.load_study(study_name=name, storage=storage))
        except KeyError:
            known = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
            raise ArgumentError(f"study={name!r} not found in {redact(url)}; studies there: {known}") from None
    # The default file is named from the studies through file_stem: it stays in REPORTS whatever the names hold.
    out = write_report(studies, args.get("out") or REPORTS / f"{file_stem(names)}.html", redact(url), chips=chips)
    print(f"wrote {out} ({out.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
