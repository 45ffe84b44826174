"""The HTML page: one study, or several side by side, with plotly.js inlined once (it opens offline)."""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Callable
from pathlib import Path

import optuna
from optuna.trial import TrialState
from plotly.offline import get_plotlyjs

from dashboards import report_compare as compare
from dashboards import report_curves as curves
from dashboards import report_optuna as study_views
from dashboards import report_project as project_views
from dashboards.report_confirm import confirm_block
from dashboards.report_evidence import evidence_paragraph
from dashboards.report_reeval import reeval_block
from dashboards.report_tables import best_block, trial_table
from dashboards.report_view import Section, StudyView
from storage.trial_record import TrialOutcome

PLOT_CONFIG = {"displaylogo": False, "responsive": True}
# The job's costs the objective is plotted against (trial attributes, by their TrialOutcome fields).
PARAMS_ATTR, COMPUTE_ATTR = TrialOutcome.names_of(lambda o: (o.params_count, o.compute_flops))

# Figure ids of one study in report order, with their section titles.
FIGURES: dict[str, str] = {
    **{
        k: study_views.FIGURES[k]
        for k in ("fig-optimization-history", "fig-param-importances", "fig-parallel-coordinate")
    },
    **curves.FIGURES,
    **{k: study_views.FIGURES[k] for k in ("fig-slice", "fig-pareto-front")},
    **project_views.FIGURES,
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
h2.study { font-size: 1.7em; border-bottom: 3px solid #1f77b4; margin-top: 2.5em; }
.meta { color: #555; } .note { color: #777; font-style: italic; } .caption { color: #555; font-size: 0.9em; margin-top: 0.2em; }
.errors { background: #fee; border: 1px solid #c00; color: #900; padding: 0.6em; white-space: pre-wrap; }
table.trials, table.params, table.facts { border-collapse: collapse; font-size: 0.85em; margin: 0.4em 0; }
table td, table th { border: 1px solid #ddd; padding: 2px 6px; text-align: left; vertical-align: top; }
table.facts th, #compare-summary th { background: #f6f6f6; white-space: nowrap; }
code.cmd { display: block; white-space: pre-wrap; word-break: break-all; background: #f6f6f6; padding: 0.4em; }
td.num { white-space: nowrap; } td.params { min-width: 24em; } .kv { white-space: nowrap; margin-right: 0.7em; } .muted { color: #888; }
.state-pruned { color: #777; } .state-fail { color: #c00; } .state-complete { color: #060; }
nav { line-height: 1.8; } nav a { margin-right: 0.8em; white-space: nowrap; }
</style>"""


def build_sections(view: StudyView) -> list[Section]:
    """Every figure of one study, in FIGURES order; one that cannot be drawn becomes a note, not a failed report."""
    builders: dict[str, Callable[[], Section]] = {
        "fig-optimization-history": lambda: study_views.optimization_history(view),
        "fig-param-importances": lambda: study_views.param_importances(view),
        "fig-parallel-coordinate": lambda: study_views.parallel_coordinate(view),
        "fig-intermediate-values": lambda: curves.intermediate_values(view),
        "fig-curves": lambda: curves.metric_curves(view),
        "fig-slice": lambda: study_views.slices(view),
        "fig-pareto-front": lambda: study_views.pareto_front(view),
        "fig-accuracy-vs-params": lambda: project_views.objective_vs_cost(view, "fig-accuracy-vs-params", PARAMS_ATTR, "parameters", log_x=True),
        "fig-accuracy-vs-compute": lambda: project_views.objective_vs_cost(view, "fig-accuracy-vs-compute", COMPUTE_ATTR, "training compute (FLOPs)", log_x=True),
        "fig-accuracy-by-optimizer": lambda: project_views.by_optimizer(view),
        "fig-curriculum": lambda: project_views.settings_effect(view, "fig-curriculum", project_views.CURRICULUM_PREFIXES, "curriculum"),
        "fig-halting": lambda: project_views.settings_effect(view, "fig-halting", project_views.HALTING_PREFIXES, "halting"),
        "fig-seed-spread": lambda: project_views.seed_spread(view),
    }  # fmt: skip
    sections = []
    for fig_id in FIGURES:
        try:
            sections.append(builders[fig_id]())
        except Exception as err:  # noqa: BLE001 - one figure that cannot be drawn must not cost the whole report
            sections.append(
                Section(
                    view.prefix + fig_id,
                    FIGURES[fig_id],
                    note=f"Could not be drawn for this study ({type(err).__name__}: {err}).",
                )
            )
    return sections


def render_section(s: Section) -> str:
    parts = [f'<section id="sec-{s.fig_id}"><h2>{html.escape(s.title)}</h2>']
    if s.figure is not None:
        s.figure.update_layout(margin=dict(t=max(50, s.figure.layout.margin.t or 0)))
        height = "480px" if s.figure.layout.height is None else f"{s.figure.layout.height}px"
        parts.append(
            s.figure.to_html(
                full_html=False, include_plotlyjs=False, div_id=s.fig_id, config=PLOT_CONFIG, default_height=height
            )
        )
        if s.caption:
            parts.append(f'<p class="caption" data-caption="{s.fig_id}">{html.escape(s.caption)}</p>')
    if s.note:
        parts.append(f'<p class="note" data-figure="{s.fig_id}">{html.escape(s.note)}</p>')
    parts.append("</section>")
    return "\n".join(parts)


def summary_line(view: StudyView) -> str:
    counts = ", ".join(f"{s.name.lower()} {n}" for s in TrialState if (n := sum(t.state == s for t in view.trials)))
    best = view.best()
    if best and not view.multi:
        shown = f"; best trial {best[0].number}: {view.objective} = {best[0].values[0]:.4g} (parameters below)"
    elif best:
        shown = f"; Pareto front: trials {', '.join(str(t.number) for t in best)}"
    else:
        shown = ""
    directions = "/".join(d.name.lower() for d in view.study.directions)
    return f"objective {', '.join(view.objectives)} ({directions}); trials: {counts or 'none'}{shown}"


def study_body(view: StudyView, heading: str | None = None) -> list[str]:
    """One study's part of the page: summary, links to its figures, best trial, figures, trials table."""
    sections = build_sections(view)
    nav = " ".join(f'<a href="#sec-{s.fig_id}">{html.escape(s.title)}</a>' for s in sections if s.figure is not None)
    parts = [heading or "", f'<p class="meta">{html.escape(summary_line(view))}</p>', evidence_paragraph(view),
             f'<nav><a href="#{view.prefix}best-params">Best trial</a> {nav} <a href="#sec-{view.prefix}trials">Trials</a></nav>',
             best_block(view), confirm_block(view) or reeval_block(view)]  # fmt: skip
    parts += [render_section(s) for s in sections]
    parts.append(f'<section id="sec-{view.prefix}trials"><h2>Trials</h2>{trial_table(view)}</section>')
    return parts


def render_html(views: list[StudyView], source: str = "") -> str:
    """The whole page: one study as before, or a comparison first and then each study in turn."""
    names = [v.name for v in views]
    title = names[0] if len(views) == 1 else " vs ".join(names)
    generated = f"generated {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M UTC}" + (f"; storage {source}" if source else "")
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{html.escape(title)}: trm-sweeps report</title>",
        ERROR_COLLECTOR, STYLE, f'<script type="text/javascript">{get_plotlyjs()}</script>', "</head><body>",
        f"<h1>{'Study' if len(views) == 1 else 'Studies'} {html.escape(title)}</h1>", f'<p class="meta">{html.escape(generated)}</p>',
        '<div id="report-errors" class="errors" hidden></div>',
    ]  # fmt: skip
    if len(views) == 1:
        parts += study_body(views[0])
    else:
        links = " ".join(f'<a href="#study-{v.prefix.rstrip("-")}">{html.escape(v.name)}</a>' for v in views)
        parts.append(f'<nav><a href="#sec-compare">Comparison</a> {links}</nav>')
        parts.append(f'<section id="sec-compare"><h2>Comparison</h2>{compare.summary_table(views)}</section>')
        parts.append(render_section(compare.compare_best(views)))
        for v in views:
            parts += study_body(
                v, f'<h2 class="study" id="study-{v.prefix.rstrip("-")}">Study {html.escape(v.name)}</h2>'
            )
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(
    studies: optuna.Study | list[optuna.Study], out: str | Path, source: str = "", chips: int | None = None
) -> Path:
    """Write the report of one study (or several, compared) to `out` (parent directories created)."""
    studies = [studies] if isinstance(studies, optuna.Study) else list(studies)
    views = [StudyView(s, chips=chips, prefix="" if len(studies) == 1 else f"s{i + 1}-") for i, s in enumerate(studies)]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(views, source), encoding="utf-8")
    return out
