"""Several studies on one page: best-so-far of each against trial number, study hours or chip-hours, and a
side-by-side summary table. Each study is read in its own direction on its own first objective."""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go
from optuna.trial import FrozenTrial, TrialState
from plotly.colors import qualitative

from dashboards.report_tables import esc
from dashboards.report_view import (
    Section,
    StudyView,
    fmt_seconds,
    plain_params,
)

X_AXES = {
    "trial": "trial number",
    "hours": "hours since the study's first trial started",
    "chip_hours": "cumulative chip-hours of finished trials",
}
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


def best_so_far(view: StudyView, order: Callable[[FrozenTrial], Any]) -> list[tuple[FrozenTrial, float]]:
    """(trial, best value up to it) for the completed trials in `order`."""
    out: list[tuple[FrozenTrial, float]] = []
    for t in sorted(view.complete, key=order):
        v = view.value(t)
        best = v if not out else (max if view.maximize else min)(out[-1][1], v)
        out.append((t, best))
    return out


def study_start(view: StudyView) -> dt.datetime | None:
    starts = [t.datetime_start for t in view.trials if t.datetime_start is not None]
    return min(starts) if starts else None


def chip_hours_known(view: StudyView) -> bool:
    return bool(view.complete) and all(
        view.chip_hours(t) is not None for t in view.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
    )


def cumulative_chip_hours(view: StudyView, trial: FrozenTrial) -> float:
    """Chip-hours of every trial that finished no later than `trial` (failed ones count when recorded)."""
    end = trial.datetime_complete
    return sum(view.chip_hours(t) or 0.0 for t in view.trials
               if t.state in FINISHED and t.datetime_complete is not None and end is not None and t.datetime_complete <= end)  # fmt: skip


def _points(view: StudyView, axis: str) -> tuple[list[float], list[float], list[str]]:
    start = study_start(view)
    if axis == "trial":
        pairs = best_so_far(view, lambda t: t.number)
        xs = [float(t.number) for t, _ in pairs]
    else:
        pairs = best_so_far(view, lambda t: t.datetime_complete or dt.datetime.max)
        if axis == "hours":
            xs = [
                (t.datetime_complete - start).total_seconds() / 3600 if t.datetime_complete and start else float("nan")
                for t, _ in pairs
            ]
        else:
            xs = [cumulative_chip_hours(view, t) for t, _ in pairs]
    texts = [f"{view.name}: trial {t.number}<br>value {view.value(t):.4g}<br>best so far {b:.4g}" for t, b in pairs]
    return xs, [b for _, b in pairs], texts


def compare_best(views: list[StudyView]) -> Section:
    s = Section("fig-compare-best", "Best so far, study by study")
    shown = [v for v in views if v.complete]
    if not shown:
        s.note = "No study has a completed trial yet."
        return s
    axes = ["trial", "hours"] + (["chip_hours"] if all(chip_hours_known(v) for v in shown) else [])
    fig = go.Figure()
    data: dict[str, dict[str, list[Any]]] = {a: {"x": [], "y": [], "hovertext": []} for a in axes}
    for i, view in enumerate(shown):
        colour = qualitative.D3[i % len(qualitative.D3)]
        for a in axes:
            x, y, text = _points(view, a)
            data[a]["x"].append(x)
            data[a]["y"].append(y)
            data[a]["hovertext"].append(text)
        fig.add_trace(go.Scatter(x=data["trial"]["x"][-1], y=data["trial"]["y"][-1], hovertext=data["trial"]["hovertext"][-1], hoverinfo="text",
                                 mode="lines+markers", line=dict(shape="hv", color=colour, width=2.5), marker=dict(size=6),
                                 name=f"{view.name} ({view.objective}, {'max' if view.maximize else 'min'})"))  # fmt: skip
    buttons = [dict(label=X_AXES[a].split(" ")[0] if a != "chip_hours" else "chip-hours", method="update",
                    args=[data[a], {"xaxis.title.text": X_AXES[a]}]) for a in axes]  # fmt: skip
    fig.update_layout(xaxis_title=X_AXES["trial"], yaxis_title="best value so far", legend=dict(orientation="h", y=-0.2), margin=dict(t=70),
                      updatemenus=[dict(type="buttons", direction="right", x=0, xanchor="left", y=1.02, yanchor="bottom", buttons=buttons)])  # fmt: skip
    s.figure = fig
    objectives = {(v.objective, v.maximize) for v in shown}
    s.caption = "Each study's best completed value so far, in its own direction."
    if len(objectives) > 1:
        s.caption += " The studies optimize different objectives or directions: compare their shapes, not their levels."
    if "chip_hours" not in axes:
        s.caption += " No chip-hour axis: some finished trial has no recorded train time or chip count (pass chips=N)."
    return s


def _short(spec: object) -> str:
    """`{"_target_": "optuna.pruners.MedianPruner", ...}` or "TPESampler" -> the class name ("?" when not recorded)."""
    if isinstance(spec, dict):
        spec = spec.get("_target_")
    return str(spec).rsplit(".", 1)[-1] if spec else "?"


def summary_table(views: list[StudyView]) -> str:
    """One column per study: what it optimized, how far it got, what it cost."""

    def best(v: StudyView, show: Callable[[FrozenTrial], str]) -> str:
        trials = v.best()
        return show(trials[0]) if trials else ""

    def total_hours(v: StudyView) -> str:
        hours = [v.chip_hours(t) for t in v.trials if t.state in FINISHED]
        known = [h for h in hours if h is not None]
        return (
            ""
            if not known
            else f"{sum(known):.3g}"
            + ("" if len(known) == len(hours) else f" ({len(known)} of {len(hours)} trials recorded)")
        )

    def span(v: StudyView) -> str:
        start, ends = study_start(v), [t.datetime_complete for t in v.trials if t.datetime_complete]
        return fmt_seconds((max(ends) - start).total_seconds()) if start and ends else ""

    rows: list[tuple[str, Callable[[StudyView], str]]] = [
        ("objective", lambda v: esc(f"{v.objective} ({'maximize' if v.maximize else 'minimize'})" + (" + " + ", ".join(v.objectives[1:]) if v.multi else ""))),
        ("sampler / pruner", lambda v: esc(f"{_short(v.attrs.sampler)} / {_short(v.attrs.pruner)}")),
        ("trials", lambda v: esc(", ".join(f"{n} {s.name.lower()}" for s in TrialState if (n := sum(t.state == s for t in v.trials))))),
        ("best value", lambda v: best(v, lambda t: esc(t.values[0]))),
        ("best trial", lambda v: best(v, lambda t: esc(t.number))),
        ("best parameters", lambda v: best(v, lambda t: "<br>".join(f"{html.escape(k)}={esc(x)}" for k, x in plain_params(t).items()))),
        ("train time (sum)", lambda v: esc(fmt_seconds(sum(v.train_seconds(t) or 0.0 for t in v.trials)))),
        ("chip-hours (sum)", total_hours),
        ("first start to last finish", lambda v: esc(span(v))),
    ]  # fmt: skip
    head = "<tr><th></th>" + "".join(f"<th>{html.escape(v.name)}</th>" for v in views) + "</tr>"
    body = "".join(
        f"<tr><th>{html.escape(label)}</th>" + "".join(f"<td>{cell(v)}</td>" for v in views) + "</tr>"
        for label, cell in rows
    )
    return f'<table class="trials" id="compare-summary">{head}{body}</table>'
