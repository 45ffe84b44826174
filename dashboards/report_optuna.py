"""Optuna's views of a study (history, importances, parallel coordinates, Pareto front) and the slice grid.

Optuna draws most of them well; the slices are drawn here because Optuna puts every parameter in one row,
where the tick labels of a study with many parameters run into each other.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import optuna
import plotly.graph_objects as go
from optuna.distributions import (
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from plotly.subplots import make_subplots

from dashboards.report_view import (
    Section,
    StudyView,
    hover,
    param_label,
    varying_params,
)

# Importances from fewer completed trials than this are noise dressed as a ranking: the report says so instead.
MIN_IMPORTANCE_TRIALS = 10
GRID_COLUMNS = 3
SUBPLOT_HEIGHT = 290

FIGURES: dict[str, str] = {
    "fig-optimization-history": "Optimization history",
    "fig-param-importances": "Parameter importances",
    "fig-parallel-coordinate": "Parallel coordinates",
    "fig-slice": "Slices (objective against each parameter)",
    "fig-pareto-front": "Pareto front (study objectives)",
}


def _optuna_plot(fn: Callable[..., go.Figure], view: StudyView, **kwargs: Any) -> go.Figure:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "experimental", "empty plot" warnings: the notes say why instead
        return fn(view.study, **kwargs)


def section(view: StudyView, fig_id: str, title: str) -> Section:
    return Section(view.prefix + fig_id, title)


def optimization_history(view: StudyView) -> Section:
    s = section(view, "fig-optimization-history", FIGURES["fig-optimization-history"])
    if not view.complete:
        s.note = "No completed trial yet."
        return s
    s.figure = _optuna_plot(optuna.visualization.plot_optimization_history, view, **view.optuna_kwargs())
    return s


def param_importances(view: StudyView) -> Section:
    s = section(view, "fig-param-importances", FIGURES["fig-param-importances"])
    n = len(view.complete)
    if n < MIN_IMPORTANCE_TRIALS:
        s.note = (f"Not shown: importances need at least {MIN_IMPORTANCE_TRIALS} completed trials and this study has {n}; "
                  "from fewer they rank noise.")  # fmt: skip
        return s
    if not varying_params(view.complete):
        s.note = f"Not shown: no parameter varies across the {n} completed trials."
        return s
    try:
        s.figure = _optuna_plot(optuna.visualization.plot_param_importances, view, **view.optuna_kwargs())
    except Exception as err:  # noqa: BLE001 - e.g. too few distinct values for the evaluator
        s.note = f"Importances cannot be computed for this study yet ({type(err).__name__}: {err})."
        return s
    for trace in s.figure.data:  # `optim.lr [lion]`, and room for the longest name
        trace.y = [param_label(str(name)) for name in trace.y]
    s.figure.update_yaxes(automargin=True, title_text=None)
    s.caption = (f"Caveat: computed (Optuna's fANOVA) from {n} completed trials; shown from {MIN_IMPORTANCE_TRIALS} on. "
                 "With few trials read it as a hint of which parameters matter, not a measurement.")  # fmt: skip
    return s


def parallel_coordinate(view: StudyView) -> Section:
    s = section(view, "fig-parallel-coordinate", FIGURES["fig-parallel-coordinate"])
    if not view.complete or not any(t.params for t in view.complete):
        s.note = "No completed trial with parameters yet."
        return s
    s.figure = _optuna_plot(optuna.visualization.plot_parallel_coordinate, view, **view.optuna_kwargs())
    ticks = s.figure.layout.xaxis.ticktext  # Optuna 5 names the axes with x tick labels: `optim.lr [lion]` as elsewhere
    if ticks:
        s.figure.update_xaxes(ticktext=[param_label(str(t)) for t in ticks])
    return s


def pareto_front(view: StudyView) -> Section:
    s = section(view, "fig-pareto-front", FIGURES["fig-pareto-front"])
    if not view.multi:
        s.note = "Single-objective study (see objective vs parameter count / compute below)."
        return s
    if not view.complete:
        s.note = "No completed trial yet."
        return s
    s.figure = _optuna_plot(optuna.visualization.plot_pareto_front, view, target_names=view.objectives)
    return s


def grid(titles: list[str], y_title: str) -> go.Figure:
    """Subplots, at most GRID_COLUMNS a row, each titled above its plot: no label runs into its neighbour's."""
    cols = min(GRID_COLUMNS, len(titles))
    rows = math.ceil(len(titles) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, shared_yaxes=True,  # ~90 px between rows: title and ticks
                        horizontal_spacing=0.07, vertical_spacing=min(0.3, 90 / (SUBPLOT_HEIGHT * rows)))  # fmt: skip
    fig.update_yaxes(title_text=y_title, col=1)
    fig.update_xaxes(automargin=True, tickangle=-30, nticks=8)
    fig.update_layout(height=SUBPLOT_HEIGHT * rows + 80, showlegend=False)
    return fig


def _is_log(dist: Any) -> bool:
    return isinstance(dist, (FloatDistribution, IntDistribution)) and dist.log


def slices(view: StudyView) -> Section:
    """The objective against each parameter, one subplot per parameter, points coloured by trial number."""
    s = section(view, "fig-slice", FIGURES["fig-slice"])
    trials = [t for t in view.complete if t.params]
    if not trials:
        s.note = "No completed trial with parameters yet."
        return s
    names = sorted({p for t in trials for p in t.params})
    fig = grid([param_label(p) for p in names], view.objective)
    last = max(t.number for t in view.trials)
    for i, name in enumerate(names):
        row, col = i // GRID_COLUMNS + 1, i % GRID_COLUMNS + 1
        group = [t for t in trials if name in t.params]
        dist = group[0].distributions[name]
        categorical = isinstance(dist, CategoricalDistribution)
        choices = [str(c) for c in dist.choices] if isinstance(dist, CategoricalDistribution) else []
        fig.add_trace(go.Scatter(
            x=[str(t.params[name]) if categorical else t.params[name] for t in group], y=[view.value(t) for t in group],
            mode="markers", hovertext=[hover(t, view) for t in group], hoverinfo="text", showlegend=False,
            marker=dict(size=8, color=[t.number for t in group], coloraxis="coloraxis", line=dict(width=0.5, color="#333")),
        ), row=row, col=col)  # fmt: skip
        if categorical:
            fig.update_xaxes(type="category", categoryorder="array", categoryarray=choices, row=row, col=col)
        elif _is_log(dist):
            fig.update_xaxes(type="log", row=row, col=col)
    fig.update_layout(
        coloraxis=dict(
            colorscale="Blues",
            cmin=0,
            cmax=max(last, 1),
            colorbar=dict(
                title="trial", thickness=12, yanchor="top", y=1, len=max(0.3, 1 / math.ceil(len(names) / GRID_COLUMNS))
            ),
        )
    )
    s.figure = fig
    return s
