"""The horizon replays as one figure (issue 54): a column per table (500, 1,000, 2,000 steps; each seed), the share
of studies holding a near-best configuration against the compute paid (with the 90% goal and the 40% budget as
lines), and below it the regret on a log axis: its median, and for the chosen rule and `none` a band from the 10th
to the 90th percentile of the replays. Written as plotly HTML and, through headless Chromium, as PNG (as
bench/trm_bench/figure.py).

    python -m bench.trm_bench.horizon_figure bench/results/trm_bench_horizon.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from bench.trm_bench.figure import write_figure
from bench.trm_bench.horizon import CURVE_POINTS
from bench.trm_bench.rule_choice import GOAL_FOUND, GOAL_SHARE

BANDED = ("none",)  # the rules whose regret band is drawn, beside the chosen one's
REGRET_FLOOR = 1e-3  # a log axis has no 0: a regret below this is drawn at it (the y-axis title says so)


def band_colour(colour: str, alpha: float = 0.15) -> str:
    """The D3 colour as a translucent fill."""
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def figure(result: dict[str, Any]) -> go.Figure:
    rows = result["rows"]
    tables = list(dict.fromkeys(r["table"] for r in rows))
    rules = list(dict.fromkeys(r["rule"] for r in rows))
    first = {t: next(r for r in rows if r["table"] == t) for t in tables}
    titles = [f"{t}: {first[t]['steps']} steps, {first[t]['configurations']} configurations" for t in tables]
    fig = make_subplots(rows=2, cols=len(tables), subplot_titles=titles, vertical_spacing=0.12)
    x = [i / (CURVE_POINTS - 1) for i in range(CURVE_POINTS)]
    chosen = result.get("choice", {}).get("rule")
    for row in rows:
        col = tables.index(row["table"]) + 1
        colour = qualitative.D3[rules.index(row["rule"]) % len(qualitative.D3)]
        width = 3 if row["rule"] == chosen else 1.5
        curves = row["curves"]
        show = col == 1
        fig.add_trace(
            go.Scatter(x=x, y=curves["found"], mode="lines", name=row["rule"], legendgroup=row["rule"],
                       showlegend=show, line={"color": colour, "width": width}),
            row=1, col=col,
        )  # fmt: skip
        low = [max(v, REGRET_FLOOR) for v in curves["regret_p10"]]
        high = [max(v, REGRET_FLOOR) for v in curves["regret_p90"]]
        if row["rule"] in BANDED or row["rule"] == chosen:  # every rule's band at once hides them all
            fig.add_trace(
                go.Scatter(x=x + x[::-1], y=high + low[::-1], fill="toself", fillcolor=band_colour(colour),
                           line={"width": 0}, legendgroup=row["rule"], showlegend=False, hoverinfo="skip"),
                row=2, col=col,
            )  # fmt: skip
        fig.add_trace(
            go.Scatter(x=x, y=[max(v, REGRET_FLOOR) for v in curves["regret_p50"]], mode="lines",
                       legendgroup=row["rule"], showlegend=False, line={"color": colour, "width": width}),
            row=2, col=col,
        )  # fmt: skip
    for col in range(1, len(tables) + 1):
        fig.add_hline(y=GOAL_FOUND, line={"dash": "dash", "color": "black", "width": 1}, row=1, col=col)
        for r in (1, 2):
            fig.add_vline(x=GOAL_SHARE, line={"dash": "dot", "color": "black", "width": 1}, row=r, col=col)
    fig.update_xaxes(title_text="compute paid, share of the unpruned grid", tickformat=".0%", range=[0, 1])
    fig.update_yaxes(tickformat=".0%", range=[0, 1.02], row=1)
    fig.update_yaxes(type="log", row=2)
    fig.update_yaxes(title_text="studies near the best (seed mean, eval + seed SE)", row=1, col=1)
    fig.update_yaxes(title_text=f"regret (exact), log; < {REGRET_FLOOR:g} drawn at it", row=2, col=1)
    fig.update_layout(
        title=f"Pruning rules at each horizon, random orders; dashed: the {GOAL_FOUND:.0%} goal, dotted: the "
        f"{GOAL_SHARE:.0%} budget; thick: the chosen rule ({chosen})",
        width=380 * len(tables) + 200,
        height=760,
        template="plotly_white",
    )
    return fig


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("result", type=Path, help="a bench/trm_bench/horizon.py result JSON")
    args = p.parse_args(argv)
    fig = figure(json.loads(args.result.read_text()))
    write_figure(fig, args.result, width=int(fig.layout.width) + 40, height=800)


if __name__ == "__main__":
    main()
