"""The default against every bare sampler x pruner pair as one figure (issue 54): a panel per horizon, on its worse
seed, each strategy at the share of studies that hold a near-best configuration against what the slice paid (the
median, and a bar from the 10th to the 90th percentile of the replays), with the 90% goal and the 40% budget as
lines. Colour: the sampler; symbol: the pruner; the default a large star. Plotly HTML and PNG (as figure.py).

    python -m bench.trm_bench.pairs_figure bench/results/trm_bench_pairs.json
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
from bench.trm_bench.rule_choice import GOAL_FOUND, GOAL_SHARE

SYMBOLS = {"none": "circle", "median": "square", "percentile": "diamond", "successive_halving": "triangle-up",
           "hyperband": "x"}  # fmt: skip


def figure(result: dict[str, Any]) -> go.Figure:
    horizons = result["horizons"]
    titles = [
        f"{h['name']}: {h['steps']} steps, {h['configurations']} configurations, seed {h['worse_seed']}"
        for h in horizons
    ]
    fig = make_subplots(rows=1, cols=max(len(horizons), 1), subplot_titles=titles)
    samplers = sorted({r["strategy"].split("/")[0] for h in horizons for r in h["rows"]})
    shown: set[str] = set()
    for col, h in enumerate(horizons, start=1):
        for r in h["rows"]:
            if r["seed"] != h["worse_seed"]:
                continue
            sampler, pruner, _ = r["strategy"].split("/")
            name = f"{r['strategy']} (default)" if r["default"] else f"{sampler}/{pruner}"
            paid = r["paid_at_end_median"]
            fig.add_trace(
                go.Scatter(
                    x=[paid], y=[r["near_best_at_end"]], mode="markers", name=name, legendgroup=name,
                    showlegend=name not in shown,
                    marker={"color": "black" if r["default"] else qualitative.D3[samplers.index(sampler) % 10],
                            "symbol": "star" if r["default"] else SYMBOLS.get(pruner, "circle-open"),
                            "size": 18 if r["default"] else 10},
                    error_x={"type": "data", "symmetric": False, "array": [r["paid_at_end_p90"] - paid],
                             "arrayminus": [paid - r["paid_at_end_p10"]], "thickness": 1, "width": 3},
                ),
                row=1, col=col,
            )  # fmt: skip
            shown.add(name)
        fig.add_hline(y=GOAL_FOUND, line={"dash": "dash", "color": "black", "width": 1}, row=1, col=col)
        fig.add_vline(x=GOAL_SHARE, line={"dash": "dot", "color": "black", "width": 1}, row=1, col=col)
    fig.update_xaxes(title_text="paid at n_trials: wall x trials at once, share of the unpruned grid", tickformat=".0%")
    fig.update_yaxes(tickformat=".0%", range=[0, 1.02])
    fig.update_yaxes(title_text="studies ending near the best (seed mean, eval + seed SE)", row=1, col=1)
    fig.update_layout(
        title=f"The default against every bare sampler x pruner, {result['workers']} trials at once, n_trials "
        f"{result['n_trials']}<br>dashed: the {GOAL_FOUND:.0%} goal, dotted: the {GOAL_SHARE:.0%} budget; bars: "
        "10th-90th percentile of what the replays paid",
        width=560 * max(len(horizons), 1) + 420,
        height=1000,
        legend={"font": {"size": 10}, "tracegroupgap": 0},
        template="plotly_white",
    )
    return fig


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("result", type=Path, help="a bench/trm_bench/pairs.py result JSON")
    args = p.parse_args(argv)
    fig = figure(json.loads(args.result.read_text()))
    write_figure(fig, args.result, width=int(fig.layout.width) + 40, height=int(fig.layout.height) + 40)


if __name__ == "__main__":
    main()
