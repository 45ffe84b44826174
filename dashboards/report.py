"""`python -m dashboards.report study=NAME [storage.url=...] [storage.password_env=NAME] [out=FILE.html]`

One self-contained HTML file per study (plotly.js inlined once; opens offline, can be mailed or archived):
Optuna's views (optimization history, parameter importances, parallel coordinates, intermediate values =
pruning curves, slices, the Pareto front of multi-objective studies) and this project's own: accuracy vs
parameter count and vs training compute with their Pareto fronts, accuracy by optimizer, the effect of
curriculum and halting settings, and the seed spread of replicated configurations. A figure that does not
apply to the study is left out with a one-line note saying why.

Every figure is a `<div id="fig-...">` (the ids in FIGURES). Needs nothing but the storage: works for a
study written from another machine.
"""
from __future__ import annotations

import datetime as dt
import html
import json
import math
import statistics
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import plotly.graph_objects as go
from optuna.trial import FrozenTrial, TrialState
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from storage import redact
from storage.cli import ArgumentError, parse_args, run_cli, storage_from_args

KNOWN = {"study": None, "storage.url": None, "storage.password_env": None, "out": None}
OPTIMIZER_PARAM = "optim"
CURRICULUM_PREFIXES = ("curriculum.",)
HALTING_PREFIXES = ("halting.", "arch.halt_max_steps")
PLOT_CONFIG = {"displaylogo": False, "responsive": True}

# Figure ids in report order, with their section titles.
FIGURES: dict[str, str] = {
    "fig-optimization-history": "Optimization history",
    "fig-param-importances": "Parameter importances",
    "fig-parallel-coordinate": "Parallel coordinates",
    "fig-intermediate-values": "Intermediate values (pruning curves)",
    "fig-slice": "Slices",
    "fig-pareto-front": "Pareto front (study objectives)",
    "fig-accuracy-vs-params": "Objective vs parameter count",
    "fig-accuracy-vs-compute": "Objective vs training compute",
    "fig-accuracy-by-optimizer": "Objective by optimizer",
    "fig-curriculum": "Effect of the curriculum settings",
    "fig-halting": "Effect of the halting settings",
    "fig-seed-spread": "Seed spread of replicated configurations",
}

# Records script errors (also those of plotly.js itself) and shows them at the top of the report.
ERROR_COLLECTOR = """<script>
window.__reportErrors = [];
(function () {
  function show() {
    var box = document.getElementById("report-errors");
    if (!box || !window.__reportErrors.length) return;
    box.hidden = false;
    box.textContent = "Some figures failed to render:\\n" + window.__reportErrors.join("\\n");
  }
  function record(message) { window.__reportErrors.push(String(message)); show(); }
  window.addEventListener("error", function (e) {
    record((e.message || "error") + (e.filename ? " (" + e.filename.slice(-60) + ":" + e.lineno + ")" : ""));
  });
  window.addEventListener("unhandledrejection", function (e) { record("unhandled rejection: " + (e.reason && e.reason.message || e.reason)); });
  var consoleError = console.error;
  console.error = function () { record(Array.prototype.join.call(arguments, " ")); return consoleError.apply(console, arguments); };
  document.addEventListener("DOMContentLoaded", show);
})();
</script>"""

STYLE = """<style>
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1300px; padding: 1em 2em; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
.meta { color: #555; } .note { color: #777; font-style: italic; }
.errors { background: #fee; border: 1px solid #c00; color: #900; padding: 0.6em; white-space: pre-wrap; }
table.trials { border-collapse: collapse; font-size: 0.85em; } table.trials td, table.trials th { border: 1px solid #ddd; padding: 2px 6px; text-align: left; }
nav { line-height: 1.8; } nav a { margin-right: 0.8em; white-space: nowrap; }
</style>"""


@dataclass
class Section:
    fig_id: str
    title: str
    figure: go.Figure | None = None
    note: str | None = None  # why the figure was left out, or a caption


class StudyView:
    """What the figures need to know about a study: its objective, directions and finished trials."""

    def __init__(self, study: optuna.Study):
        self.study = study
        self.trials = study.get_trials(deepcopy=False)
        self.multi = len(study.directions) > 1
        attrs = study.user_attrs
        objectives = attrs.get("objectives") or [attrs.get("objective") or "objective"]
        self.objective = str(objectives[0])
        self.objectives = [str(o) for o in objectives]
        self.reported = str(attrs.get("prune_metric") or self.objective)  # what the intermediate values are
        self.maximize = study.directions[0] == optuna.study.StudyDirection.MAXIMIZE
        self.complete = [t for t in self.trials if t.state == TrialState.COMPLETE and t.values]
        self.pruned = [t for t in self.trials if t.state == TrialState.PRUNED]

    def value(self, trial: FrozenTrial) -> float:
        return trial.values[0]

    def optuna_kwargs(self) -> dict[str, Any]:
        """Optuna's plots need an explicit target for multi-objective studies (the first objective)."""
        return {"target": self.value, "target_name": self.objective} if self.multi else {"target_name": self.objective}

    def last_report(self, trial: FrozenTrial) -> float | None:
        if not trial.intermediate_values:
            return None
        return trial.intermediate_values[max(trial.intermediate_values)]


def base_name(param: str) -> str:
    """`optim.lr@lion` (a conditional parameter) -> `optim.lr`."""
    return param.split("@", 1)[0]


def hover(trial: FrozenTrial, view: StudyView) -> str:
    params = "<br>".join(f"{k}={v}" for k, v in sorted(trial.params.items()))
    value = f"{view.value(trial):.4g}" if trial.values else "-"
    return f"trial {trial.number} ({trial.state.name.lower()})<br>{view.objective}={value}<br>{params}"


def pareto(points: list[tuple[float, float, FrozenTrial]], maximize: bool) -> list[tuple[float, float, FrozenTrial]]:
    """Non-dominated points: smaller x (cost) and better y (objective). Sorted by x."""
    front, best = [], -math.inf
    for x, y, t in sorted(points, key=lambda p: (p[0], -p[1] if maximize else p[1])):
        score = y if maximize else -y
        if score > best:
            front.append((x, y, t))
            best = score
    return front


# --------------------------------------------------------------------------------- Optuna's own views


def _optuna_plot(fn: Callable[..., go.Figure], view: StudyView, **kwargs: Any) -> go.Figure:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "experimental", "empty plot" warnings: the notes say why instead
        return fn(view.study, **kwargs)


def optimization_history(view: StudyView) -> Section:
    s = Section("fig-optimization-history", FIGURES["fig-optimization-history"])
    if not view.complete:
        s.note = "No completed trial yet."
        return s
    s.figure = _optuna_plot(optuna.visualization.plot_optimization_history, view, **view.optuna_kwargs())
    return s


def varying_params(trials: list[FrozenTrial]) -> list[str]:
    values: dict[str, set[str]] = {}
    for t in trials:
        for k, v in t.params.items():
            values.setdefault(k, set()).add(repr(v))
    return sorted(k for k, vs in values.items() if len(vs) > 1)


def param_importances(view: StudyView) -> Section:
    s = Section("fig-param-importances", FIGURES["fig-param-importances"])
    if len(view.complete) < 2:
        s.note = f"Needs at least 2 completed trials (this study has {len(view.complete)})."
        return s
    if not varying_params(view.complete):
        s.note = "No parameter varies across the completed trials."
        return s
    kwargs = view.optuna_kwargs()
    try:
        s.figure = _optuna_plot(optuna.visualization.plot_param_importances, view, **kwargs)
    except Exception as err:  # noqa: BLE001 - e.g. too few distinct values for the evaluator
        s.note = f"Importances cannot be computed for this study yet ({type(err).__name__}: {err})."
    return s


def parallel_coordinate(view: StudyView) -> Section:
    s = Section("fig-parallel-coordinate", FIGURES["fig-parallel-coordinate"])
    if not view.complete or not any(t.params for t in view.complete):
        s.note = "No completed trial with parameters yet."
        return s
    s.figure = _optuna_plot(optuna.visualization.plot_parallel_coordinate, view, **view.optuna_kwargs())
    return s


def intermediate_values(view: StudyView) -> Section:
    s = Section("fig-intermediate-values", FIGURES["fig-intermediate-values"])
    if view.multi:
        s.note = "Multi-objective study: trials report no intermediate values (Optuna prunes single-objective studies only)."
        return s
    if not any(t.intermediate_values for t in view.trials):
        s.note = "No trial reported intermediate values."
        return s
    s.figure = _optuna_plot(optuna.visualization.plot_intermediate_values, view)
    s.figure.update_layout(xaxis_title="training step", yaxis_title=view.reported)
    return s


def slices(view: StudyView) -> Section:
    s = Section("fig-slice", FIGURES["fig-slice"])
    if not view.complete or not any(t.params for t in view.complete):
        s.note = "No completed trial with parameters yet."
        return s
    s.figure = _optuna_plot(optuna.visualization.plot_slice, view, **view.optuna_kwargs())
    s.figure.update_layout(width=None, autosize=True)  # Optuna sizes it 300 px per parameter: fit the page instead
    return s


def pareto_front(view: StudyView) -> Section:
    s = Section("fig-pareto-front", FIGURES["fig-pareto-front"])
    if not view.multi:
        s.note = "Single-objective study (see objective vs parameter count / compute below)."
        return s
    if not view.complete:
        s.note = "No completed trial yet."
        return s
    s.figure = _optuna_plot(optuna.visualization.plot_pareto_front, view, target_names=view.objectives)
    return s


# ------------------------------------------------------------------------------ this project's views


def objective_vs_cost(view: StudyView, fig_id: str, attr: str, label: str, log_x: bool) -> Section:
    """The objective against a cost recorded by the job (user attribute), with the Pareto front."""
    s = Section(fig_id, FIGURES[fig_id])
    points = [(float(t.user_attrs[attr]), view.value(t), t) for t in view.complete if t.user_attrs.get(attr) is not None]
    if not points:
        s.note = f"No completed trial recorded `{attr}`."
        return s
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=[p[0] for p in points], y=[p[1] for p in points], mode="markers", name="completed",
        marker=dict(size=9, color=[p[2].number for p in points], colorscale="Blues", showscale=True, colorbar=dict(title="trial")),
        hovertext=[hover(p[2], view) for p in points], hoverinfo="text",
    ))  # fmt: skip
    pruned = [(float(t.user_attrs[attr]), view.last_report(t), t) for t in view.pruned if t.user_attrs.get(attr) is not None and view.last_report(t) is not None]
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
    s.note = f"Pareto front: no other completed trial is both cheaper and better ({len(front)} of {len(points)} trials)."
    return s


def by_optimizer(view: StudyView) -> Section:
    s = Section("fig-accuracy-by-optimizer", FIGURES["fig-accuracy-by-optimizer"])
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
    s = Section(fig_id, FIGURES[fig_id])
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
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=names, shared_yaxes=True, horizontal_spacing=0.06, vertical_spacing=0.18)
    for i, name in enumerate(names):
        row, col = i // cols + 1, i % cols + 1
        pairs = columns[name]
        values = [v for v, _ in pairs]
        if _is_numeric(values) and len({*values}) > 2:
            trace = go.Scatter(x=values, y=[view.value(t) for _, t in pairs], mode="markers", marker=dict(size=8, color="#1f77b4"),
                               hovertext=[hover(t, view) for _, t in pairs], hoverinfo="text", showlegend=False)  # fmt: skip
        else:
            trace = go.Box(x=[str(v) for v in values], y=[view.value(t) for _, t in pairs], boxpoints="all", jitter=0.4, pointpos=0,
                           marker=dict(color="#1f77b4"), hovertext=[hover(t, view) for _, t in pairs], hoverinfo="text+y", showlegend=False)  # fmt: skip
        fig.add_trace(trace, row=row, col=col)
    fig.update_yaxes(title_text=view.objective, col=1)
    fig.update_layout(height=max(380, 330 * rows))
    s.figure = fig
    return s


def seed_spread(view: StudyView) -> Section:
    s = Section("fig-seed-spread", FIGURES["fig-seed-spread"])
    trials = [t for t in view.complete if len(t.user_attrs.get("seed_values") or []) > 1]
    if not trials:
        s.note = "No configuration was run with several seeds (study.seeds > 1 records `seed_values`)."
        return s
    trials.sort(key=lambda t: statistics.fmean(t.user_attrs["seed_values"]), reverse=view.maximize)
    labels = [f"trial {t.number}" for t in trials]
    fig = go.Figure()
    xs, ys, texts = [], [], []
    for label, t in zip(labels, trials):
        for i, v in enumerate(t.user_attrs["seed_values"]):
            xs.append(label)
            ys.append(v)
            texts.append(f"{label}, seed {i}: {v:.4g}")
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name="one seed", marker=dict(size=8, color="#1f77b4", opacity=0.7), hovertext=texts, hoverinfo="text"))
    means = [statistics.fmean(t.user_attrs["seed_values"]) for t in trials]
    stds = [statistics.pstdev(t.user_attrs["seed_values"]) for t in trials]
    fig.add_trace(go.Scatter(
        x=labels, y=means, mode="markers", name="mean ± std", marker=dict(size=14, symbol="line-ew-open", color="#d62728", line=dict(width=3)),
        error_y=dict(type="data", array=stds, visible=True, color="#d62728"), hovertext=[hover(t, view) for t in trials], hoverinfo="text",
    ))  # fmt: skip
    fig.update_layout(xaxis_title="configuration (best mean first)", yaxis_title=view.objective)
    s.figure = fig
    s.note = f"{len(trials)} configuration(s) with {', '.join(sorted({str(len(t.user_attrs['seed_values'])) for t in trials}))} seeds each."
    return s


def build_sections(study: optuna.Study) -> list[Section]:
    view = StudyView(study)
    builders: list[tuple[str, Callable[[], Section]]] = [
        ("fig-optimization-history", lambda: optimization_history(view)),
        ("fig-param-importances", lambda: param_importances(view)),
        ("fig-parallel-coordinate", lambda: parallel_coordinate(view)),
        ("fig-intermediate-values", lambda: intermediate_values(view)),
        ("fig-slice", lambda: slices(view)),
        ("fig-pareto-front", lambda: pareto_front(view)),
        ("fig-accuracy-vs-params", lambda: objective_vs_cost(view, "fig-accuracy-vs-params", "params_count", "parameters", log_x=True)),
        ("fig-accuracy-vs-compute", lambda: objective_vs_cost(view, "fig-accuracy-vs-compute", "compute_flops", "training compute (FLOPs)", log_x=True)),
        ("fig-accuracy-by-optimizer", lambda: by_optimizer(view)),
        ("fig-curriculum", lambda: settings_effect(view, "fig-curriculum", CURRICULUM_PREFIXES, "curriculum")),
        ("fig-halting", lambda: settings_effect(view, "fig-halting", HALTING_PREFIXES, "halting")),
        ("fig-seed-spread", lambda: seed_spread(view)),
    ]
    sections = []
    for fig_id, build in builders:
        try:
            sections.append(build())
        except Exception as err:  # noqa: BLE001 - one figure that cannot be drawn must not cost the whole report
            sections.append(Section(fig_id, FIGURES[fig_id], note=f"Could not be drawn for this study ({type(err).__name__}: {err})."))
    return sections


# ------------------------------------------------------------------------------------------- the page


def _trial_table(view: StudyView) -> str:
    rows = []
    for t in view.trials:
        value = "" if not t.values else ", ".join(f"{v:.4g}" for v in t.values)
        params = " ".join(f"{k}={v}" for k, v in sorted(t.params.items()))
        cells = [t.number, t.state.name, value, t.user_attrs.get("best_step", ""), params]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("#", "state", "value", "best step", "parameters"))
    return f'<table class="trials" id="trials"><tr>{head}</tr>{"".join(rows)}</table>'


def render_html(study: optuna.Study, sections: list[Section], source: str = "") -> str:
    view = StudyView(study)
    counts = ", ".join(f"{s.name.lower()} {n}" for s in TrialState if (n := sum(t.state == s for t in view.trials)))
    best = ""
    if not view.multi and view.complete:
        b = study.best_trial
        best = f"best trial {b.number}: {view.objective} = {b.value:.4g} ({html.escape(json.dumps(b.params, default=str))})"
    elif view.multi and view.complete:
        best = f"Pareto front: trials {', '.join(str(t.number) for t in study.best_trials)}"
    directions = "/".join(d.name.lower() for d in study.directions)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(study.study_name)}: trm-sweeps report</title>",
        ERROR_COLLECTOR,
        STYLE,
        f'<script type="text/javascript">{get_plotlyjs()}</script>',
        "</head><body>",
        f"<h1>Study {html.escape(study.study_name)}</h1>",
        f'<p class="meta">objective {html.escape(", ".join(view.objectives))} ({directions}); trials: {counts or "none"}'
        + (f"; {best}" if best else "")
        + (f"<br>storage {html.escape(source)}" if source else "")
        + f"; generated {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}</p>",
        '<div id="report-errors" class="errors" hidden></div>',
        "<nav>" + " ".join(f'<a href="#sec-{s.fig_id}">{html.escape(s.title)}</a>' for s in sections if s.figure is not None) + "</nav>",
    ]
    for s in sections:
        parts.append(f'<section id="sec-{s.fig_id}"><h2>{html.escape(s.title)}</h2>')
        if s.figure is not None:
            s.figure.update_layout(margin=dict(t=50))
            parts.append(s.figure.to_html(full_html=False, include_plotlyjs=False, div_id=s.fig_id, config=PLOT_CONFIG, default_height="480px" if s.figure.layout.height is None else f"{s.figure.layout.height}px"))
        if s.note:
            parts.append(f'<p class="note" data-figure="{s.fig_id}">{html.escape(s.note)}</p>')
        parts.append("</section>")
    parts.append(f'<section id="sec-trials"><h2>Trials</h2>{_trial_table(view)}</section>')
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(study: optuna.Study, out: str | Path, source: str = "") -> Path:
    """Write the study's report to `out` (parent directories created); returns the path."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(study, build_sections(study), source), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    return run_cli(report, argv)


def report(argv: list[str]) -> int:
    args = parse_args(argv, KNOWN, (__doc__ or "").strip())
    if not args.get("study"):
        raise ArgumentError("study=NAME is required (python -m sweeps.status lists the studies)")
    name = args["study"]
    url, storage = storage_from_args(args)
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        known = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
        raise ArgumentError(f"study={name!r} not found in {redact(url)}; studies there: {known}") from None
    out = write_report(study, args.get("out") or f"outputs/reports/{name}.html", redact(url))
    print(f"wrote {out} ({out.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
