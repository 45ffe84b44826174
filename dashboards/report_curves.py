"""Per-trial curves: the reported metric (intermediate values, what the pruner saw) and every metric in the
trials' metrics files, against training step, wall-clock seconds or chip-hours.

Each line is one trial, named in the legend and the hover with its number and state: completed trials solid
and coloured, pruned ones dashed grey, running or failed ones dotted. Nothing is interpolated into a curve;
only the time axes are estimates (a job records when its first and last steps ran, see report_view.Clock).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from optuna.trial import FrozenTrial, TrialState
from plotly.colors import qualitative

from contracts.metrics_log import METRICS_FILE, WALL_TIME_KEY, read_metrics
from dashboards.report_view import Section, StudyView
from storage.trial_record import TrialLaunch

FIGURES: dict[str, str] = {
    "fig-intermediate-values": "Intermediate values (pruning curves)",
    "fig-curves": "Training and eval curves (every logged metric)",
}
# trm.train's out_dir under the trial's workdir, as the driver sets it (`out_dir=<run_root>/trial-<n>/run`).
RUN_DIR = "run"  # the trial workdir's training output (the driver's out_dir=<workdir>/run)
MAX_LEGEND_TRIALS = 30  # beyond this the legend names the groups only (the hover still names every trial)
MAX_POINTS = 400  # per curve from a metrics file: a long run logs thousands; every k-th point and the last are kept
STATE_ORDER = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.FAIL, TrialState.WAITING)
PRUNED_GREY = "#8c8c8c"
X_AXES = {
    "step": "training step",
    "seconds": "wall-clock (seconds since the trial's job started)",
    "chip_hours": "chip-hours",
}


@dataclass
class Curve:
    trial: FrozenTrial
    steps: list[float]
    values: list[float]


def reported_curves(view: StudyView) -> list[Curve]:
    return [Curve(t, sorted(t.intermediate_values), [t.intermediate_values[s] for s in sorted(t.intermediate_values)])
            for t in view.trials if t.intermediate_values]  # fmt: skip


def metrics_dir(trial: FrozenTrial) -> Path | None:
    """The trial's run directory if its metrics file (every train/eval record, the ones W&B gets) is here."""
    workdir = TrialLaunch.of(trial.user_attrs).workdir
    run = Path(str(workdir), RUN_DIR) if workdir else None
    return run if run is not None and (run / METRICS_FILE).is_file() else None


def thin(steps: list[float], values: list[float]) -> tuple[list[float], list[float]]:
    """At most MAX_POINTS of a curve's own points (every k-th and the last): the page stays small, nothing is made up."""
    if len(steps) <= MAX_POINTS:
        return steps, values
    keep = sorted({*range(0, len(steps), -(-len(steps) // MAX_POINTS)), len(steps) - 1})
    return [steps[i] for i in keep], [values[i] for i in keep]


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def file_curves(view: StudyView) -> tuple[dict[str, list[Curve]], int, bool]:
    """{metric: one curve per trial} from the metrics files readable here, reported metric first; the number of
    files read; whether some curve was thinned to MAX_POINTS."""
    by_metric: dict[str, list[Curve]] = {}
    files, thinned = 0, False
    for t in view.trials:
        path = metrics_dir(t)
        if path is None:
            continue
        files += 1
        points: dict[str, dict[float, float]] = {}
        for record in read_metrics(path):
            for key, value in record.items():
                if key not in ("step", WALL_TIME_KEY) and _number(value):
                    points.setdefault(key, {})[record["step"]] = float(
                        value
                    )  # a resumed run logs a step again: last wins
        for key, by_step in points.items():
            thinned |= len(by_step) > MAX_POINTS
            by_metric.setdefault(key, []).append(
                Curve(t, *thin(sorted(by_step), [by_step[s] for s in sorted(by_step)]))
            )
    first = [m for m in dict.fromkeys([view.reported, view.objective]) if m in by_metric]
    rest = sorted(
        set(by_metric) - set(first),
        key=lambda m: (not m.startswith("eval/"), not m.startswith("train/"), not m.endswith(("loss", "accuracy")), m),
    )
    return {m: by_metric[m] for m in first + rest}, files, thinned


def _style(trial: FrozenTrial) -> dict[str, Any]:
    if trial.state == TrialState.COMPLETE:
        return dict(color=qualitative.Plotly[trial.number % len(qualitative.Plotly)], width=2)
    if trial.state == TrialState.PRUNED:
        return dict(color=PRUNED_GREY, width=1.5, dash="dash")
    return dict(color="#d62728" if trial.state == TrialState.FAIL else "#ff7f0e", width=1.5, dash="dot")


def _x(view: StudyView, curve: Curve, axis: str) -> list[float | None]:
    clock = view.clock(curve.trial)
    if axis == "step":
        return list(curve.steps)
    if clock is None:
        return [None] * len(curve.steps)
    return [clock.seconds(s) if axis == "seconds" else clock.chip_hours(s) for s in curve.steps]


def axes_available(view: StudyView, curves: list[Curve]) -> tuple[list[str], str]:
    """The x axes some trial's record allows, and a sentence on how the time axes are estimated."""
    trials = {c.trial.number: c.trial for c in curves}
    clocks = {n: view.clock(t) for n, t in trials.items()}
    timed = [n for n, c in clocks.items() if c is not None]
    chipped = [n for n in timed if clocks[n].chips is not None]  # type: ignore[union-attr]
    axes = ["step"] + (["seconds"] if timed else []) + (["chip_hours"] if chipped else [])
    if not timed:
        return (
            axes,
            "No wall-clock or chip-hour axis: no trial here recorded `timing` or `train_seconds` (its job stores them when it ends).",
        )
    words = ("Wall-clock: a step is placed linearly between the job's recorded first and last step times (`timing`, else "
             "`train_seconds`); an estimate, not a per-step log.")  # fmt: skip
    if len(timed) < len(trials):
        words += f" {len(trials) - len(timed)} of {len(trials)} trials recorded no timing (still running or failed early) and are left out of the time views."
    if chipped:
        words += " Chip-hours: those seconds times the trial's chips (`chips=N`, else the chips its slot gave it)."
    else:
        words += " No chip-hour axis: the trials' chip count is not recorded (pass chips=N)."
    return axes, words


def curve_figure(view: StudyView, by_metric: dict[str, list[Curve]]) -> tuple[go.Figure, str]:
    """One line per trial and metric; a dropdown picks the metric, buttons the x axis. Returns (figure, caption)."""
    fig = go.Figure()
    metrics = list(by_metric)
    every = [c for m in metrics for c in by_metric[m]]
    axes, caption = axes_available(view, every)
    xs: dict[str, list[list[float | None]]] = {a: [] for a in axes}
    owner: list[str] = []  # the metric of each trace
    for index, metric in enumerate(metrics):
        curves = sorted(by_metric[metric], key=lambda c: (STATE_ORDER.index(c.trial.state), c.trial.number))
        counts = {s: sum(c.trial.state == s for c in curves) for s in STATE_ORDER}
        per_trial = len(curves) <= MAX_LEGEND_TRIALS
        shown: set[TrialState] = set()
        for c in curves:
            state, number = c.trial.state.name.lower(), c.trial.number
            group = f"{state} ({counts[c.trial.state]})"
            fig.add_trace(go.Scatter(
                x=c.steps, y=c.values, customdata=c.steps, mode="lines+markers", visible=index == 0, line=_style(c.trial),
                marker=dict(size=5), name=f"trial {number}" if per_trial else group, legendgroup=f"{metric}|{state}",
                legendgrouptitle_text=group if per_trial else None, showlegend=per_trial or c.trial.state not in shown,
                hovertemplate=f"trial {number} ({state})<br>step %{{customdata}}<br>{metric}=%{{y:.4g}}<extra></extra>",
            ))  # fmt: skip
            shown.add(c.trial.state)
            owner.append(metric)
            for a in axes:
                xs[a].append(_x(view, c, a))
    menus = []
    if len(axes) > 1:
        menus.append(dict(type="buttons", direction="right", x=0, xanchor="left", y=1.02, yanchor="bottom", showactive=True,
                          buttons=[dict(label=X_AXES[a].split(" (")[0], method="update", args=[{"x": xs[a]}, {"xaxis.title.text": X_AXES[a]}])
                                   for a in axes]))  # fmt: skip
    if len(metrics) > 1:
        menus.append(dict(type="dropdown", x=1, xanchor="right", y=1.02, yanchor="bottom", showactive=True,
                          buttons=[dict(label=m, method="update", args=[{"visible": [o == m for o in owner]}, {"yaxis.title.text": m}])
                                   for m in metrics]))  # fmt: skip
    fig.update_layout(xaxis_title=X_AXES["step"], yaxis_title=metrics[0], updatemenus=menus, hovermode="closest",
                      legend=dict(groupclick="toggleitem", tracegroupgap=12), margin=dict(t=70))  # fmt: skip
    return fig, caption


def intermediate_values(view: StudyView) -> Section:
    s = Section(view.prefix + "fig-intermediate-values", FIGURES["fig-intermediate-values"])
    if view.multi:
        s.note = (
            "Multi-objective study: trials report no intermediate values (Optuna prunes single-objective studies only)."
        )
        return s
    curves = reported_curves(view)
    if not curves:
        s.note = "No trial reported intermediate values."
        return s
    s.figure, axes = curve_figure(view, {view.reported: curves})
    states = ", ".join(
        f"{n} {st.name.lower()}" for st in STATE_ORDER if (n := sum(c.trial.state == st for c in curves))
    )
    s.caption = f"{view.reported} at each eval, as reported to the pruner ({states}): completed solid, pruned dashed grey. {axes}"
    return s


def metric_curves(view: StudyView) -> Section:
    s = Section(view.prefix + "fig-curves", FIGURES["fig-curves"])
    by_metric, files, thinned = file_curves(view)
    if not by_metric:
        where = f"<workdir>/{RUN_DIR}/{METRICS_FILE}"
        s.note = (f"No trial's metrics file ({where}, written by trm.train: the records W&B gets) is readable from this machine; "
                  "the reported metric's curves are the pruning curves above.")  # fmt: skip
        return s
    s.figure, axes = curve_figure(view, by_metric)
    s.caption = (
        f"From {files} trial(s)' metrics files, {len(by_metric)} metrics: pick one in the menu above the plot. {axes}"
    )
    if thinned:
        s.caption += f" Curves of more than {MAX_POINTS} logged points show every k-th point and the last."
    return s
