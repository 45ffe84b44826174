"""The report's confirmed ranking: the top configurations trained again on fresh seeds (sweeps/trials/confirm.py), each
ranked by its mean over seeds with its eval + seed standard error, beside the trial's own value and its
re-evaluation; the line when the top two cannot be told apart. Where the stage ran it is the study's one ranking
(the re-evaluation's section gives way to it: its values are a column here)."""

from __future__ import annotations

import html

from dashboards.report_view import StudyView, fmt_value
from sweeps.trials.confirm_rank import interval, tie_line
from sweeps.trials.confirmed import confirmed_ranking, ranking_eval, trials_winner
from sweeps.trials.reeval import interval as reeval_interval
from sweeps.trials.reeval import ranking


def confirm_block(view: StudyView) -> str | None:
    """The confirmed ranking's table; None where nothing was confirmed (the re-evaluation's section stands)."""
    if view.multi:
        return None
    confirmed = confirmed_ranking(view.study)
    if not confirmed:
        return None
    sid = f"{view.prefix}confirm"
    trials = {t.number: t for t in view.study.get_trials(deepcopy=False)}
    again = {r.trial.number: r.reeval for r in ranking(view.study)}
    metric = view.objectives[0]
    on = ranking_eval(view.study)  # one eval for every value: the re-evaluation's where each value has one
    head = [
        "rank",
        "trial",
        f"{metric}: mean over seeds on {on} (± 1 s.e.)",
        "values (seed)",
        "reported",
        "re-evaluated",
    ]
    rows = []
    for place, c in enumerate(confirmed, 1):
        values = ", ".join(f"{v.value:.4f}" + (f" ({v.seed})" if v.seed is not None else " (trial)") for v in c.values)
        reeval = again.get(c.trial)
        cells = (
            str(place),
            str(c.trial),
            interval(c),
            values,
            fmt_value(trials[c.trial].value),
            reeval_interval(reeval) if reeval is not None else "",
        )
        rows.append("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in cells) + "</tr>")
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    own = trials_winner(view.study)
    if own is not None and own.number != confirmed[0].trial:
        verdict = f"The confirmed winner, trial {confirmed[0].trial}, differs from the trials' own winner, trial {own.number}."
    else:
        verdict = f"The confirmed winner, trial {confirmed[0].trial}, is the trials' own winner."
    tie = tie_line(confirmed)
    parts = [
        f'<section id="{sid}"><h2>Confirmed ranking</h2>',
        f'<p class="note" id="{sid}-winner">{html.escape(verdict)}</p>',
        f'<table class="trials" id="{sid}-table"><tr>{header}</tr>{"".join(rows)}</table>',
        f'<p class="note" id="{sid}-tie">{html.escape(tie)}</p>' if tie else "",
        '<p class="caption">The top configurations trained again on fresh training seeds: each is ranked by its mean '
        "over seeds (its own trial included), with one standard error that counts the training seed's variance "
        '(pooled across these configurations where each has few seeds) and the eval\'s binomial noise ("eval + seed"; '
        "\"eval\" where the seed variance is not known yet). Reported is Optuna's value, the trial's own small eval; "
        "re-evaluated, its checkpoint on a larger eval.</p>",
        "</section>",
    ]
    return "\n".join(p for p in parts if p)
