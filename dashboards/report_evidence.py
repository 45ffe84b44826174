"""The report's one line on what the evidence-checking pruner measured (contracts/pruning/evidence.py): which audit
trials it measured on and, per step, the rank agreement and whether pruning was on there. Read from the study
record (StudyAttrs.pruner_evidence), as the job's pruner last wrote it; nothing when the study has no such record."""

from __future__ import annotations

import html

from dashboards.report_view import StudyView
from storage.record import EvidenceRecord


def evidence_text(record: EvidenceRecord) -> str:
    """E.g. "audit trials 0, 1, 2, 3; Kendall tau at step 100: -0.33 (off), 400: 0.67 (on, n 4); on needs ..."."""
    rungs = sorted(record.get("rungs", {}).items(), key=lambda kv: int(kv[0]))
    cells = ", ".join(
        f"{step}: {'n/a' if r['tau'] is None else format(r['tau'], '.2f')} ({'on' if r['on'] else 'off'}, n {r['n']})"
        for step, r in rungs
    )
    audits = ", ".join(str(n) for n in record.get("audit_trials", [])) or "none completed yet"
    return (
        f"Pruning checked its evidence: audit trials (never pruned) {audits}; rank agreement (Kendall tau) of each "
        f"step's value with the final value: {cells or 'not measured yet'}. A step prunes only when on "
        f"(tau >= {record.get('min_agreement')} over >= {record.get('min_audit')} audit trials)."
    )


def evidence_paragraph(view: StudyView) -> str:
    """The line as HTML, or "" for a study whose pruner recorded no evidence."""
    record = view.attrs.pruner_evidence
    if not isinstance(record, dict):
        return ""
    return f'<p class="meta" id="{view.prefix}pruner-evidence">{html.escape(evidence_text(record))}</p>'
