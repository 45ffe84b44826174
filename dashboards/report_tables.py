"""The report's tables: the best trial(s) as things to paste, and every trial with its duration and links.

The best trial is described by `sweeps.best.describe`, the same description `python -m sweeps.best` prints, so
the plain override names, the re-train command and the checkpoint path agree between the two.
"""

from __future__ import annotations

import html
import shlex
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from dashboards.report_view import (
    StudyView,
    duration,
    fmt_seconds,
    fmt_value,
    plain_params,
)
from storage.record import DUPLICATE_OF_ATTR, FAIL_REASON_ATTR, Reeval, samples_per_s
from storage.trial_record import TrialLaunch, TrialOutcome
from sweeps.best import BestTrial, describe
from sweeps.trials.reeval import interval

MAX_PARETO_SHOWN = 5  # Pareto trials described in full; the trials table has the rest
NOTE_CHARS = 160


def esc(value: Any) -> str:
    return html.escape(fmt_value(value))


def link(url: str | None, label: str | None = None) -> str:
    """A location as a link where a browser opens it (http(s), file, an absolute local path), else as text."""
    if not url:
        return ""
    text, title = html.escape(label or url), html.escape(url)
    if url.startswith(("http://", "https://", "file://")):
        return f'<a href="{title}" title="{title}">{text}</a>'
    if "://" not in url and Path(url).is_absolute():
        return f'<a href="{html.escape(Path(url).as_uri())}" title="{title}">{text}</a>'
    return f'<code title="{title}">{text}</code>'  # gs://, a path relative to the pod's remote_dir: copy it


def wandb_dir(trial: FrozenTrial) -> Path | None:
    """The trial's local W&B run directory (an offline run to `wandb sync`), when this machine has it."""
    workdir = TrialLaunch.of(trial.user_attrs).workdir
    root = Path(str(workdir), "run", "wandb") if workdir else None
    if root is None or not root.is_dir():
        return None
    runs = sorted(p for p in root.glob("*run-*") if p.is_dir())
    return runs[-1] if runs else None


def wandb_cell(info: BestTrial, trial: FrozenTrial) -> str:
    """The W&B run a launched trial's job opened (group/name, trm/tracking/run_config.py), and its local directory if
    here."""
    if not TrialLaunch.of(trial.user_attrs).workdir:
        return ""  # never launched (refused as a duplicate, failed before its job started): no run
    name = f"{info.wandb['group']}/{info.wandb['name']}"
    local = wandb_dir(trial)
    return f'<span class="kv">{html.escape(name)}</span>' + (f" ({link(str(local), 'local run')})" if local else "")


def trial_note(trial: FrozenTrial) -> str:
    attrs = trial.user_attrs
    if attrs.get(DUPLICATE_OF_ATTR) is not None:
        return f"same parameters as trial {attrs[DUPLICATE_OF_ATTR]}"
    text = str(attrs.get(FAIL_REASON_ATTR) or TrialOutcome.of(attrs).error or "")
    return text if len(text) <= NOTE_CHARS else "..." + text[-NOTE_CHARS:]


def best_block(view: StudyView) -> str:
    """The best trial (or the first Pareto trials): its plain overrides, re-train command, checkpoint, W&B run."""
    sid = f"{view.prefix}best-params"
    trials = view.best()
    if not trials:
        return f'<section id="{sid}"><h2>Best trial</h2><p class="note">No completed trial yet.</p></section>'
    title = (
        "Best trial"
        if not view.multi
        else f"Pareto-front trials ({len(trials)}; the first {min(len(trials), MAX_PARETO_SHOWN)} shown)"
    )
    parts = [f'<section id="{sid}" class="best"><h2>{title}</h2>']
    for trial in trials[:MAX_PARETO_SHOWN]:
        info = describe(view.study, trial)
        values = ", ".join(f"{name} = {fmt_value(v)}" for name, v in zip(view.objectives, trial.values))
        step = f" at step {info.best_step}" if info.best_step is not None else ""
        parts.append(
            f"<p><b>trial {trial.number}</b> ({trial.state.name.lower()}): {html.escape(values)}{html.escape(step)}</p>"
        )
        rows = "".join(f"<tr><td><code>{html.escape(k)}</code></td><td><code>{html.escape(v)}</code></td></tr>"
                       for k, _, v in (o.partition("=") for o in info.overrides))  # fmt: skip
        parts.append(f'<table class="params"><tr><th>parameter (override)</th><th>value</th></tr>{rows}</table>')
        again = Reeval.of(info.reeval)  # its re-evaluation on a larger eval (sweeps/trials/reeval.py), if any
        mine = info.confirmed  # its mean over fresh training seeds (sweeps/trials/confirm.py), if confirmed
        confirmed = f"{mine['mean']:.4f} ± {mine['se']:.4f} ({mine['se_kind']} SE, {mine['n']} seeds)" if mine else ""
        facts = [
            *([("confirmed", html.escape(confirmed))] if mine else []),
            *([("re-evaluated", html.escape(f"{again.metric} = {interval(again)}"))] if again else []),
            ("re-train", f'<code class="cmd">{html.escape(shlex.join(info.retrain))}</code>'),
            (
                "best checkpoint",
                (link(info.best_checkpoint) or "not recorded")
                + (f" <b>warning:</b> {html.escape(info.best_checkpoint_note)}" if info.best_checkpoint_note else ""),
            ),
            ("W&B run", wandb_cell(info, trial)),
            ("git commit", html.escape(info.commit_text())),
            ("code version", html.escape(info.code_version or "not recorded")),
            ("workdir", link(info.workdir) or "not recorded"),
        ]
        parts.append(
            '<table class="facts">' + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts) + "</table>"
        )
    parts.append("</section>")
    return "\n".join(parts)


def code_cell(info: BestTrial) -> str:
    """The trial table's `code`: its git commit, short (`+` with uncommitted changes), else its content hash, short;
    both in full on hover."""
    commit, version = info.code_commit, info.code_version or ""
    shown = f"{commit[:12]}{'+' if info.code_dirty else ''}" if commit else version[:12]
    return f'<span title="commit {html.escape(info.commit_text())}; content hash {html.escape(version)}">{html.escape(shown)}</span>'


def trial_table(view: StudyView) -> str:
    """Every trial: state, value, best step, durations, plain parameters, checkpoint and W&B links, why it failed."""
    show_chips = any(view.chip_hours(t) is not None for t in view.trials)
    speeds = {t.number: samples_per_s(t.user_attrs) for t in view.trials}
    show_speed = any(v is not None for v in speeds.values())
    head = ["#", "state", view.objective if not view.multi else "values", "best step", "steps", "duration", "train time",
            *(["samples/s"] if show_speed else []), *(["chip-hours"] if show_chips else []),
            "parameters", "checkpoint", "W&B run", "code", "note"]  # fmt: skip
    rows = []
    for t in view.trials:
        info = describe(view.study, t)
        took = duration(t)
        hours = view.chip_hours(t)
        last = view.last_report(t) if t.state == TrialState.PRUNED else None
        value = ", ".join(fmt_value(v) for v in t.values or []) or (
            f'<span class="muted" title="the last value it reported before it was pruned">(last {last:.4g})</span>'
            if last is not None
            else ""
        )
        cells = [  # (class, html)
            ("num", esc(t.number)), ("", f'<span class="state-{t.state.name.lower()}">{t.state.name.lower()}</span>'),
            ("num", value), ("num", esc(info.best_step)), ("num", esc(TrialOutcome.of(t.user_attrs).steps)),
            ("num", esc(fmt_seconds(took.total_seconds()) if took is not None else "")), ("num", esc(fmt_seconds(view.train_seconds(t)))),
            *([("num", esc("" if speeds[t.number] is None else f"{speeds[t.number]:.4g}"))] if show_speed else []),
            *([("num", esc("" if hours is None else f"{hours:.3g}"))] if show_chips else []),
            ("params", " ".join(f'<span class="kv">{html.escape(k)}={esc(v)}</span>' for k, v in plain_params(t).items())),
            ("", link(info.best_checkpoint, "best.pt")), ("num", wandb_cell(info, t)),
            ("", code_cell(info)), ("", html.escape(trial_note(t))),
        ]  # fmt: skip
        rows.append("<tr>" + "".join(f'<td class="{c}">{v}</td>' if c else f"<td>{v}</td>" for c, v in cells) + "</tr>")
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    caption = ("duration: Optuna's start to finish (queueing and launch included); train time: the job's own "
               "run time (`train_seconds`); samples/s: its steady-state training speed (compile, evals and "
               "checkpoints left out: python -m sweeps.utilization turns it into a fraction of the peak); "
               "checkpoint: the trial's best.pt.")  # fmt: skip
    return (f'<table class="trials" id="{view.prefix}trials"><tr>{header}</tr>{"".join(rows)}</table>'
            f'<p class="caption">{html.escape(caption)}</p>')  # fmt: skip
