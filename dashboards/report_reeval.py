"""The report's re-evaluation section: the top trials' checkpoints evaluated again on a larger eval
(sweeps/trials/reeval.py), ranked by that value with one standard error, and the line saying when the top two overlap."""

from __future__ import annotations

import html

from dashboards.report_view import StudyView, fmt_value
from sweeps.trials.reeval import interval, overlap_line, ranking


def reeval_block(view: StudyView) -> str:
    """The ranking table, or a note saying the study's top trials were not evaluated again."""
    sid = f"{view.prefix}reeval"
    ranked = ranking(view.study) if not view.multi else []
    if not ranked:
        note = "The top trials were not evaluated again (python -m sweeps.best study=NAME reeval=true does it)."
        return f'<section id="{sid}"><h2>Re-evaluation</h2><p class="note">{html.escape(note)}</p></section>'
    metric = ranked[0].reeval.metric
    head = ["rank", "trial", f"{metric} re-evaluated (± 1 s.e.)", "reported", "checkpoint step"]
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(cell)}</td>"
            for cell in (
                str(place),
                str(r.trial.number),
                interval(r.reeval),
                fmt_value(r.trial.value),
                str(r.reeval.step),
            )
        )
        + "</tr>"
        for place, r in enumerate(ranked, 1)
    )
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    overlap = overlap_line(ranked)
    parts = [
        f'<section id="{sid}"><h2>Re-evaluation</h2>',
        f'<table class="trials" id="{sid}-table"><tr>{header}</tr>{rows}</table>',
        f'<p class="note" id="{sid}-overlap">{html.escape(overlap)}</p>' if overlap else "",
        '<p class="caption">Each top trial\'s checkpoint evaluated again on a larger eval, its binomial standard '
        "error beside it; trials are ranked by it. Optuna's value (reported) is the trial's own small eval.</p>",
        "</section>",
    ]
    return "\n".join(p for p in parts if p)
