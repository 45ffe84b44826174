"""The replays as a figure a user reads in a minute: per strategy, the share of studies that hold a configuration
within one eval SE of the table's best, and the median regret, against the compute spent (a share of the unpruned
grid's training FLOPs). Written as plotly HTML and, through headless Chromium, as PNG.

    python -m bench.trm_bench.figure bench/results/trm_bench_replay_seed1.json --show tpe/none/blank,random/none/blank

--show names the strategies drawn in colour (the defaults and their rivals); every other one is a thin grey line,
so the chosen one is seen against the whole field.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

BROWSERS = ("chromium", "chromium-browser", "google-chrome")  # as tests/prereqs.py looks for one


def figure(result: dict[str, Any], shown: list[str]) -> go.Figure:
    x = [i / 100 for i in range(101)]
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("studies holding a configuration within one SE of the best", "median regret (exact accuracy)"),
    )
    rows = sorted(result["rows"], key=lambda r: r["strategy"] in shown)  # the shown ones drawn last, on top
    for row in rows:
        mine = row["strategy"] in shown
        colour = (
            qualitative.D3[shown.index(row["strategy"]) % len(qualitative.D3)] if mine else "rgba(150,150,150,0.35)"
        )
        style = {"width": 3 if mine else 1, "color": colour}
        for col, ys in ((1, row["curve"]), (2, row["regret_curve"])):
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=ys,
                    mode="lines",
                    name=row["strategy"],
                    line=style,
                    legendgroup=row["strategy"],
                    showlegend=mine and col == 1,
                    hoverinfo="name+x+y",
                ),  # fmt: skip
                row=1,
                col=col,
            )
    target = result["target"]
    fig.update_xaxes(title_text="compute, share of the unpruned grid's training FLOPs", tickformat=".0%")
    fig.update_yaxes(tickformat=".0%", row=1, col=1)
    fig.update_layout(
        title=f"TRM-Bench-tiny, seed {result['seed']}: best {target['best']:.4f} (one SE {target['se']:.4f}); "
        f"grey: every other of {len(result['rows'])} strategies",
        width=1500,
        height=560,
        margin={"r": 260},
        template="plotly_white",
    )
    return fig


def png(html: Path, out: Path, width: int = 1540, height: int = 600) -> None:
    """A screenshot of the HTML page in headless Chromium (plotly's own PNG export needs kaleido and a Chrome it
    downloads, which this machine's network does not allow)."""
    browser = next((b for b in map(shutil.which, BROWSERS) if b), None)
    if browser is None:
        raise SystemExit(f"no browser for the PNG (looked for {', '.join(BROWSERS)}): apt-get install chromium")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
             f"--window-size={width},{height}", "--virtual-time-budget=5000", f"--screenshot={out}", html.resolve().as_uri()],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip


def write_figure(fig: go.Figure, result: Path, width: int = 1540, height: int = 600) -> None:
    """The figure beside its result JSON as HTML and PNG. The HTML loads plotly.js from its CDN (inline it is 4.6 MB,
    per figure, in git); the PNG is drawn from a self-contained copy, as Chromium here reaches no network."""
    html = result.with_suffix(".html")
    fig.write_html(html, include_plotlyjs="cdn")
    with tempfile.TemporaryDirectory() as tmp:
        inline = Path(tmp) / html.name
        fig.write_html(inline, include_plotlyjs=True)
        png(inline, result.with_suffix(".png"), width, height)
    print(f"{html}\n{result.with_suffix('.png')}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("result", type=Path, help="a bench/trm_bench/replay.py result JSON")
    p.add_argument("--show", default="", help="comma list of strategies drawn in colour")
    args = p.parse_args(argv)
    result = json.loads(args.result.read_text())
    write_figure(figure(result, [s for s in args.show.split(",") if s]), args.result)


if __name__ == "__main__":
    main()
