"""This project's views of a study: objective vs model size and compute (with Pareto fronts), by optimizer, the
effect of curriculum and halting settings, and the seed spread of replicated configurations."""

from __future__ import annotations

import statistics
from typing import Any

import plotly.graph_objects as go
from optuna.trial import FrozenTrial

from dashboards.report_optuna import GRID_COLUMNS, grid
from dashboards.report_view import Section, StudyView, base_name, hover, pareto
from storage.record import SEED_VALUES_ATTR

OPTIMIZER_PARAM = "optim"
CURRICULUM_PREFIXES = ("curriculum.",)
HALTING_PREFIXES = ("halting.", "arch.halt_max_steps")

FIGURES: dict[str, str] = {
    "fig-accuracy-vs-params": "Objective vs parameter count",
    "fig-accuracy-vs-compute": "Objective vs training compute",
    "fig-accuracy-by-optimizer": "Objective by optimizer",
    "fig-curriculum": "Effect of the curriculum settings",
    "fig-halting": "Effect of the halting settings",
    "fig-seed-spread": "Seed spread of replicated configurations",
}


def objective_vs_cost(view: StudyView, fig_id: str, attr: str, label: str, log_x: bool) -> Section:
    """The objective against a cost recorded by the job (user attribute), with the Pareto front."""
    s = Section(view.prefix + fig_id, FIGURES[fig_id])
    points = [
        (float(t.user_attrs[attr]), view.value(t), t) for t in view.complete if t.user_attrs.get(attr) is not None
    ]
    if not points:
        s.note = f"No completed trial recorded `{attr}`."
        return s
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=[p[0] for p in points], y=[p[1] for p in points], mode="markers", name="completed",
        marker=dict(size=9, color=[p[2].number for p in points], colorscale="Blues", showscale=True, colorbar=dict(title="trial"), line=dict(width=0.5, color="#333")),
        hovertext=[hover(p[2], view) for p in points], hoverinfo="text",
    ))  # fmt: skip
    pruned = [
        (float(t.user_attrs[attr]), view.last_report(t), t)
        for t in view.pruned
        if t.user_attrs.get(attr) is not None and view.last_report(t) is not None
    ]
    if pruned and view.reported == view.objective:  # a pruned trial's last report is on the objective's axis
        fig.add_trace(go.Scatter(
            x=[p[0] for p in pruned], y=[p[1] for p in pruned], mode="markers", name="pruned (last report)",
            marker=dict(size=8, symbol="x", color="#bbb"), hovertext=[hover(p[2], view) for p in pruned], hoverinfo="text",
        ))  # fmt: skip
    front = pareto(points, view.maximize)
    fig.add_trace(go.Scatter(
        x=[p[0] for p in front], y=[p[1] for p in front], mode="lines+markers", name="Pareto front",
        line=dict(shape="hv", color="#d62728"), marker=dict(size=12, symbol="circle-open", color="#d62728"),
        hovertext=[hover(p[2], view) for p in front], hoverinfo="text",
    ))  # fmt: skip
    fig.update_layout(xaxis_title=label, yaxis_title=view.objective, legend=dict(orientation="h", y=1.1))
    if log_x and min(p[0] for p in points) > 0:
        fig.update_xaxes(type="log")
    s.figure = fig
    s.caption = (
        f"Pareto front: no other completed trial is both cheaper and better ({len(front)} of {len(points)} trials)."
    )
    return s


def by_optimizer(view: StudyView) -> Section:
    s = Section(view.prefix + "fig-accuracy-by-optimizer", FIGURES["fig-accuracy-by-optimizer"])
    trials = [t for t in view.complete if OPTIMIZER_PARAM in t.params]
    if not trials:
        s.note = f"The study does not search `{OPTIMIZER_PARAM}`."
        return s
    fig = go.Figure()
    for name in sorted({str(t.params[OPTIMIZER_PARAM]) for t in trials}):
        group = [t for t in trials if str(t.params[OPTIMIZER_PARAM]) == name]
        fig.add_trace(go.Box(
            y=[view.value(t) for t in group], name=f"{name} ({len(group)})", boxpoints="all", jitter=0.4, pointpos=0,
            hovertext=[hover(t, view) for t in group], hoverinfo="text+y",
        ))  # fmt: skip
    fig.update_layout(yaxis_title=view.objective, xaxis_title="optimizer (completed trials)", showlegend=False)
    s.figure = fig
    return s


def _is_numeric(values: list[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def settings_effect(view: StudyView, fig_id: str, prefixes: tuple[str, ...], what: str) -> Section:
    """One panel per searched setting: the objective against its value (box per choice, scatter for ranges)."""
    s = Section(view.prefix + fig_id, FIGURES[fig_id])
    columns: dict[str, list[tuple[Any, FrozenTrial]]] = {}
    for t in view.complete:
        for param, value in t.params.items():
            name = base_name(param)
            if name.startswith(prefixes):
                columns.setdefault(name, []).append((value, t))
    if not columns:
        s.note = f"The study searches no {what} setting ({', '.join(p.rstrip('.') + ('.*' if p.endswith('.') else '') for p in prefixes)})."
        return s
    names = sorted(columns)
    fig = grid(names, view.objective)
    for i, name in enumerate(names):
        row, col = i // GRID_COLUMNS + 1, i % GRID_COLUMNS + 1
        pairs = columns[name]
        values = [v for v, _ in pairs]
        if _is_numeric(values) and len({*values}) > 2:
            trace = go.Scatter(x=values, y=[view.value(t) for _, t in pairs], mode="markers", marker=dict(size=8, color="#1f77b4"),
                               hovertext=[hover(t, view) for _, t in pairs], hoverinfo="text", showlegend=False)  # fmt: skip
        else:
            trace = go.Box(x=[str(v) for v in values], y=[view.value(t) for _, t in pairs], boxpoints="all", jitter=0.4, pointpos=0,
                           marker=dict(color="#1f77b4"), hovertext=[hover(t, view) for _, t in pairs], hoverinfo="text+y", showlegend=False)  # fmt: skip
        fig.add_trace(trace, row=row, col=col)
    s.figure = fig
    return s


def seed_spread(view: StudyView) -> Section:
    s = Section(view.prefix + "fig-seed-spread", FIGURES["fig-seed-spread"])
    trials = [t for t in view.complete if len(t.user_attrs.get(SEED_VALUES_ATTR) or []) > 1]
    if not trials:
        s.note = "No configuration was run with several seeds (study.seeds > 1 records `seed_values`)."
        return s
    trials.sort(key=lambda t: statistics.fmean(t.user_attrs[SEED_VALUES_ATTR]), reverse=view.maximize)
    labels = [f"trial {t.number}" for t in trials]
    fig = go.Figure()
    xs, ys, texts = [], [], []
    for label, t in zip(labels, trials):
        for i, v in enumerate(t.user_attrs[SEED_VALUES_ATTR]):
            xs.append(label)
            ys.append(v)
            texts.append(f"{label}, seed {i}: {v:.4g}")
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=ys,
            mode="markers",
            name="one seed",
            marker=dict(size=8, color="#1f77b4", opacity=0.7),
            hovertext=texts,
            hoverinfo="text",
        )
    )
    means = [statistics.fmean(t.user_attrs[SEED_VALUES_ATTR]) for t in trials]
    stds = [statistics.pstdev(t.user_attrs[SEED_VALUES_ATTR]) for t in trials]
    fig.add_trace(go.Scatter(
        x=labels, y=means, mode="markers", name="mean ± std", marker=dict(size=14, symbol="line-ew-open", color="#d62728", line=dict(width=3)),
        error_y=dict(type="data", array=stds, visible=True, color="#d62728"), hovertext=[hover(t, view) for t in trials], hoverinfo="text",
    ))  # fmt: skip
    fig.update_layout(xaxis_title="configuration (best mean first)", yaxis_title=view.objective)
    s.figure = fig
    s.caption = f"{len(trials)} configuration(s) with {', '.join(sorted({str(len(t.user_attrs[SEED_VALUES_ATTR])) for t in trials}))} seeds each."
    return s
