"""The HTML study report (dashboards.report) on studies written as the driver and the jobs record them.

Trials are written straight into a SQLite storage (no training: seconds, not minutes) with the attributes a real
trial carries (storage/record.py, trm/links/trial.py), metrics files in the format trm.train writes, and the
nested facts half in their own attributes and half in the new `details` attribute. The page is then opened in
headless Chromium: plotly must draw every figure without a script error, and the screenshot must show them.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import struct
import subprocess
import zlib
from pathlib import Path

import optuna
import pytest
from optuna.distributions import (
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState, create_trial

from dashboards import report
from dashboards.report_compare import compare_best
from dashboards.report_curves import MAX_POINTS, thin
from dashboards.report_optuna import MIN_IMPORTANCE_TRIALS
from dashboards.report_view import StudyView
from tests.test_dashboards import CHROME_FLAGS, chromium, parse

SPACE = {
    "optim": CategoricalDistribution(["adamw", "lion"]),
    "optim.lr@adamw": FloatDistribution(1e-4, 1e-3, log=True),
    "optim.lr@lion": FloatDistribution(3e-5, 3e-4, log=True),
    "arch.hidden_size": CategoricalDistribution([16, 32, 64]),
    "arch.L_layers": IntDistribution(1, 4),
    "halting.exploration_prob": FloatDistribution(0.0, 0.5),
    "curriculum.enabled": CategoricalDistribution([True, False]),
}
STEPS, EVAL_EVERY, LOG_EVERY = 40, 10, 5
T0 = dt.datetime(2025, 3, 1, 9, 0, 0)
CHIPS = 4


def metrics_records(accuracy: float, last_step: int) -> list[dict]:
    """What trm.train writes to metrics.jsonl: train records every LOG_EVERY steps, eval records every EVAL_EVERY."""
    records: list[dict] = []
    for step in range(LOG_EVERY, last_step + 1, LOG_EVERY):
        records.append({"step": step, "train/lm_loss": 2.0 - accuracy * step / STEPS, "train/accuracy": accuracy * step / STEPS,
                        "train/lr": 1e-4, "train/H_cycles": 1, "train/L_cycles": 1})  # fmt: skip
        if step % EVAL_EVERY == 0:
            records.append(
                {
                    "step": step,
                    "eval/exact_accuracy": accuracy * step / STEPS,
                    "eval/lm_loss": 2.1 - accuracy * step / STEPS,
                }
            )
    return records


def add_trials(
    study: optuna.Study, root: Path, n: int, *, pruned_every: int, chips: bool, checkpoint_root: str
) -> None:
    """n trials: every `pruned_every`-th pruned at half the steps, one failed; odd trials keep nested facts in `details`."""
    study.set_user_attr("objective", "eval/exact_accuracy")
    study.set_user_attr("prune_metric", "eval/exact_accuracy")
    study.set_user_attr("sampler", "TPESampler")
    study.set_user_attr("pruner", {"_target_": "optuna.pruners.MedianPruner"})
    for i in range(n):
        optim = "lion" if i % 3 == 0 else "adamw"
        params = {"optim": optim, f"optim.lr@{optim}": (1e-4 if optim == "lion" else 3e-4) * (1 + i / n), "arch.hidden_size": [16, 32, 64][i % 3],
                  "arch.L_layers": 1 + i % 4, "halting.exploration_prob": 0.05 * (i % 10), "curriculum.enabled": i % 2 == 0}  # fmt: skip
        accuracy = 0.3 + 0.1 * (i % 3) + 0.01 * i + (0.3 if i == 12 else 0.0)  # trial 12 is the best
        pruned = i % pruned_every == pruned_every - 1
        last = STEPS // 2 if pruned else STEPS
        workdir = root / study.study_name / f"trial-{i}"
        if i != 0:  # trial 0's metrics file is on another machine: its curves come from the storage only
            (workdir / "run").mkdir(parents=True)
            (workdir / "run" / "metrics.jsonl").write_text(
                "".join(json.dumps(r) + "\n" for r in metrics_records(accuracy, last))
            )
        train_overrides = ["experiment=tiny_cpu", *(["runtime.expected_devices=4"] if chips else []),
                           *(f"{k.split('@')[0]}={v}" for k, v in params.items()), "train.objective=eval/exact_accuracy"]  # fmt: skip
        timing = {
            "run_start": 1000.0,
            "first_step_start": 1005.0,
            "first_step_end": 1006.0,
            "last_step_end": 1005.0 + last,
            "train_end": 1006.0 + last,
            "end": 1007.0 + last,
        }
        nested = {
            "timing": timing,
            "train_overrides": train_overrides,
            "final_metrics": {"eval/exact_accuracy": accuracy * last / STEPS},
            "throughput": {
                "steps": last - 10,
                "seconds": 2.0,
                "samples_per_s": 100.0 + i,
                "flops_per_s": 1e9,
                "devices": 1,
                "examples_per_device": 64.0,
            },  # fmt: skip
        }
        attrs = {"workdir": str(workdir), "checkpoint_url": f"{checkpoint_root}/trial-{i}/checkpoints", "code_version": f"c0de{i:04d}feedbeef",
                 "code_commit": f"{i:02d}" * 20, "code_dirty": i % 2 == 0,
                 "overrides": [f"{k.split('@')[0]}={v}" for k, v in params.items()], "outcome": "PRUNED" if pruned else "COMPLETE",
                 "best_step": last, "best_value": accuracy * last / STEPS, "steps": last, "train_seconds": 7.0 + last,
                 "params_count": 20 * params["arch.hidden_size"] ** 2, "compute_flops": 1e9 * (i + 1),
                 **({"details": nested} if i % 2 else nested)}  # fmt: skip
        trial = create_trial(state=TrialState.PRUNED if pruned else TrialState.COMPLETE, value=None if pruned else accuracy, params=params,
                             distributions={k: SPACE[k] for k in params}, user_attrs=attrs,
                             intermediate_values={s: accuracy * s / STEPS for s in range(EVAL_EVERY, last + 1, EVAL_EVERY)})  # fmt: skip
        trial.datetime_start = T0 + dt.timedelta(minutes=20 * i)
        trial.datetime_complete = trial.datetime_start + dt.timedelta(minutes=12, seconds=34 + i)
        study.add_trial(trial)
    failed = create_trial(state=TrialState.FAIL, params={"optim": "adamw"}, distributions={"optim": SPACE["optim"]},
                          user_attrs={"fail_reason": "job exited 1: CUDA out of memory"})  # fmt: skip
    failed.datetime_start, failed.datetime_complete = T0 + dt.timedelta(hours=9), T0 + dt.timedelta(hours=9, seconds=30)
    study.add_trial(failed)


@pytest.fixture(scope="module")
def storage_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """`big`: 14 trials (11 complete, 3 pruned) on 4 chips, checkpoints on local disk; `small`: 4 trials, 3 complete,
    no chip count, checkpoints in a bucket."""
    root = tmp_path_factory.mktemp("studies")
    url = f"sqlite:///{root / 'optuna.db'}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    add_trials(
        optuna.create_study(study_name="big", storage=url, direction="maximize"),
        root,
        14,
        pruned_every=4,
        chips=True,
        checkpoint_root=str(root / "ckpt"),
    )
    add_trials(
        optuna.create_study(study_name="small", storage=url, direction="maximize"),
        root,
        4,
        pruned_every=4,
        chips=False,
        checkpoint_root="gs://bucket/small",
    )
    return url


@pytest.fixture(scope="module")
def pages(storage_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("pages")
    for name, study in (("big", "big"), ("small", "small"), ("both", "big,small")):
        assert report.main([f"study={study}", f"storage.url={storage_url}", f"out={out / name}.html"]) == 0
    return {name: out / f"{name}.html" for name in ("big", "small", "both")}


def load(storage_url: str, name: str, **kwargs: object) -> StudyView:
    return StudyView(optuna.load_study(study_name=name, storage=storage_url), **kwargs)  # type: ignore[arg-type]


def sections(view: StudyView) -> dict:
    return {s.fig_id: s for s in report.build_sections(view)}


def element(text: str, element_id: str) -> str:
    """The HTML of the <section>/<table> with this id (they do not nest in themselves)."""
    match = re.search(rf'<(section|table)[^>]*id="{re.escape(element_id)}"[^>]*>(.*?)</\1>', text, re.S)
    assert match is not None, element_id
    return match.group(2)


def test_pruning_curves_name_each_trial_and_tell_pruned_from_complete(storage_url: str) -> None:
    fig = sections(load(storage_url, "big"))["fig-intermediate-values"].figure
    by_name = {t.name: t for t in fig.data}
    assert set(by_name) == {f"trial {i}" for i in range(14)}  # every trial that reported, by number
    for i in range(14):
        trace = by_name[f"trial {i}"]
        pruned = i % 4 == 3
        assert (trace.legendgroup, trace.legendgrouptitle.text) == (
            ("eval/exact_accuracy|pruned", "pruned (3)")
            if pruned
            else ("eval/exact_accuracy|complete", "complete (11)")
        )
        assert (trace.line.dash == "dash") == pruned and (trace.line.color == "#8c8c8c") == pruned
        assert f"trial {i} ({'pruned' if pruned else 'complete'})" in trace.hovertemplate
    assert list(by_name["trial 3"].x) == [10, 20]  # pruned at half the steps: no invented points


def test_time_axes_come_from_the_recorded_timing(storage_url: str) -> None:
    fig = sections(load(storage_url, "big"))["fig-intermediate-values"].figure
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == ["training step", "wall-clock", "chip-hours"]
    seconds, chip_hours = buttons[1].args[0]["x"], buttons[2].args[0]["x"]
    index = [t.name for t in fig.data].index("trial 5")  # odd: timing and overrides are in `details`
    # first step at 5 s, the last (step 40) ends at 45 s: step 20 at 25 s; 4 chips from runtime.expected_devices
    assert seconds[index] == pytest.approx([15, 25, 35, 45])
    assert chip_hours[index] == pytest.approx([s * CHIPS / 3600 for s in (15, 25, 35, 45)])
    small = sections(load(storage_url, "small"))["fig-intermediate-values"]
    assert [b.label for b in small.figure.layout.updatemenus[0].buttons] == ["training step", "wall-clock"]
    assert "No chip-hour axis" in small.caption and "chips=N" in small.caption
    chipped = sections(load(storage_url, "small", chips=8))["fig-intermediate-values"].figure
    assert [b.label for b in chipped.layout.updatemenus[0].buttons][-1] == "chip-hours"


def test_metric_curves_come_from_the_metrics_files(storage_url: str) -> None:
    s = sections(load(storage_url, "big"))["fig-curves"]
    owners = {t.legendgroup.split("|")[0] for t in s.figure.data}
    assert {"train/lm_loss", "eval/lm_loss", "eval/exact_accuracy", "train/accuracy"} <= owners
    menu = s.figure.layout.updatemenus[1]
    assert menu.buttons[0].label == "eval/exact_accuracy"  # the reported metric first, and the one shown
    assert all(t.visible == (t.legendgroup.startswith("eval/exact_accuracy|")) for t in s.figure.data)
    loss = {t.name: t for t in s.figure.data if t.legendgroup.startswith("train/lm_loss|")}
    assert "trial 0" not in loss and len(loss) == 13  # trial 0's file is not on this machine
    assert list(loss["trial 1"].x) == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    assert list(loss["trial 1"].y) == pytest.approx(
        [r["train/lm_loss"] for r in metrics_records(0.3 + 0.1 + 0.01, STEPS) if "train/lm_loss" in r]
    )
    assert "13 trial(s)' metrics files" in s.caption and "every k-th" not in s.caption
    steps, values = thin(list(range(5000)), [v / 2 for v in range(5000)])  # a long run: its own points, fewer
    assert len(steps) <= MAX_POINTS and steps[0] == 0 and steps[-1] == 4999 and values == [s / 2 for s in steps]


@pytest.mark.slow
def test_importances_need_enough_completed_trials_and_say_so(storage_url: str, pages: dict[str, Path]) -> None:
    big = sections(load(storage_url, "big"))["fig-param-importances"]
    assert big.figure is not None and "11 completed trials" in big.caption and "Caveat" in big.caption
    small = sections(load(storage_url, "small"))["fig-param-importances"]
    assert small.figure is None and small.note is not None
    assert f"at least {MIN_IMPORTANCE_TRIALS} completed trials and this study has 3" in small.note
    ids = parse(pages["small"].read_text())
    assert "fig-param-importances" not in ids.classes and "fig-param-importances" in ids.notes


def test_slices_put_each_parameter_in_its_own_subplot(storage_url: str) -> None:
    fig = sections(load(storage_url, "big"))["fig-slice"].figure
    titles = [a.text for a in fig.layout.annotations]
    assert (
        titles == sorted(titles)
        and "optim.lr [lion]" in titles
        and "optim.lr [adamw]" in titles
        and len(titles) == len(SPACE)
    )
    axes = [fig.layout[k] for k in sorted(fig.layout.to_plotly_json()) if re.fullmatch(r"xaxis\d*", k)]
    yaxes = {k: fig.layout[k] for k in fig.layout.to_plotly_json() if re.fullmatch(r"yaxis\d*", k)}
    rows: dict[tuple, list] = {}
    for x in axes:
        y = yaxes["yaxis" + x.plotly_name[len("xaxis") :]]
        rows.setdefault(tuple(y.domain), []).append(tuple(x.domain))
    assert len(rows) == 3 and all(len(r) <= 3 for r in rows.values())  # 7 parameters: 3 rows of at most 3
    for row in rows.values():  # side by side, with room between them, wide enough for their tick labels
        row.sort()
        assert all(a[1] < b[0] for a, b in zip(row, row[1:])) and all(hi - lo > 0.25 for lo, hi in row)
    assert fig.layout.height >= 3 * 250


def test_figures_name_conditional_parameters_without_at(storage_url: str) -> None:
    by_id = sections(load(storage_url, "big"))
    assert "optim.lr [lion]" in by_id["fig-parallel-coordinate"].figure.layout.xaxis.ticktext
    assert "optim.lr [lion]" in by_id["fig-param-importances"].figure.data[0].y
    assert not any("@" in str(t) for t in by_id["fig-parallel-coordinate"].figure.layout.xaxis.ticktext)


def test_best_trial_is_a_table_of_plain_overrides_with_its_links(pages: dict[str, Path]) -> None:
    text = pages["big"].read_text()
    best = element(text, "best-params")
    assert "@" not in re.sub(r"<[^>]+>", "", best)  # plain names only (sweeps.best's conversion)
    assert re.search(r"<code>optim\.lr</code></td><td><code>0\.0001\d*</code>", best)
    assert "python -m trm.train experiment=tiny_cpu runtime.expected_devices=4" in best  # the re-train command
    # trial 12 is the best; its checkpoint is on this disk: a file:// link to best.pt
    assert "<b>trial 12</b>" in best and re.search(r'href="file://[^"]*/ckpt/trial-12/checkpoints/best\.pt"', best)
    assert "big/big-12" in best and "c0de0012feedbeef" in best
    assert f"<th>git commit</th><td>{'12' * 20} with uncommitted changes</td>" in best  # where the code came from
    assert "gs://bucket/small/trial-" in element(
        pages["small"].read_text(), "best-params"
    )  # a bucket path: shown, not linked


def test_trials_table_has_durations_states_and_links(pages: dict[str, Path]) -> None:
    table = element(pages["big"].read_text(), "trials")
    header = re.findall(r"<th>(.*?)</th>", table)
    assert header[:7] == ["#", "state", "eval/exact_accuracy", "best step", "steps", "duration", "train time"]
    assert {"chip-hours", "parameters", "checkpoint", "W&amp;B run", "code", "note"} <= set(header)
    assert f">{'12' * 6}+</span>" in table  # code: the commit, short, `+` for uncommitted changes
    rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)[1:]
    assert len(rows) == 15
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", r, re.S) for r in rows]
    assert cells[5][5] == "12 min 39 s" and cells[5][6] == "47.0 s"  # Optuna's start to finish; the job's own time
    assert (
        "pruned" in cells[3][1] and cells[3][4] == "20" and "(last 0.165)" in cells[3][2]
    )  # its last report, not a value
    assert cells[5][header.index("chip-hours")] == f"{47 * CHIPS / 3600:.3g}"
    assert header[7] == "samples/s" and cells[5][7] == "105"  # the speed its job measured (details or top level)
    assert cells[14][7] == ""  # the failed trial never trained
    assert "@" not in "".join(c[header.index("parameters")] for c in cells)
    assert "best.pt" in cells[5][header.index("checkpoint")] and "href=" in cells[5][header.index("checkpoint")]
    assert "big/big-5" in cells[5][header.index("W&amp;B run")]
    assert "fail" in cells[14][1] and "CUDA out of memory" in cells[14][-1] and cells[14][5] == "30.0 s"
    assert cells[14][header.index("W&amp;B run")] == ""  # its job never started: no W&B run to point to


def test_two_studies_compare_on_one_page(
    storage_url: str, pages: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    text = pages["both"].read_text()
    ids = parse(text)
    assert "<h1>Studies big vs small</h1>" in text
    summary = element(text, "compare-summary")
    assert re.findall(r"<th>(big|small)</th>", summary) == ["big", "small"]
    assert "11 complete" in summary and "3 complete" in summary
    for prefix in ("s1-", "s2-"):  # each study's own report follows, under its own ids
        assert {
            f"{prefix}best-params",
            f"{prefix}trials",
            f"{prefix}fig-intermediate-values",
            f"{prefix}fig-curves",
        } <= set(ids.classes)
    assert "s1-fig-param-importances" in ids.classes and "s2-fig-param-importances" in ids.notes
    assert len(re.findall(r'Plotly\.newPlot\(\s*"fig-compare-best"', text)) == 1

    views = [load(storage_url, "big"), load(storage_url, "small")]
    fig = compare_best(views).figure
    assert [t.name.split(" ")[0] for t in fig.data] == ["big", "small"]
    assert [b.label for b in fig.layout.updatemenus[0].buttons] == ["trial", "hours"]  # small has no chip count
    assert list(fig.data[0].y) == sorted(fig.data[0].y)  # best so far of a maximized study never goes down
    chipped = compare_best([load(storage_url, "big", chips=2), load(storage_url, "small", chips=2)]).figure
    assert [b.label for b in chipped.layout.updatemenus[0].buttons] == ["trial", "hours", "chip-hours"]

    capsys.readouterr()
    assert report.main(["study=big,nope", f"storage.url={storage_url}", f"out={tmp_path / 'x.html'}"]) == 2
    assert "study='nope' not found" in capsys.readouterr().err and not (tmp_path / "x.html").exists()
    assert (
        report.main(["study=big", "chips=0", f"storage.url={storage_url}"]) == 2
        and "chips='0'" in capsys.readouterr().err
    )
    assert report.main(["--help"]) == 0 and "study=NAME[,NAME...]" in capsys.readouterr().out


def png_rows(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct scanlines) of a PNG: a blank or single-colour page has a handful of distinct rows."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        header, idat = (chunk, idat) if kind == b"IHDR" else (header, idat + chunk if kind == b"IDAT" else idat)
        pos += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", header[:10])
    stride = 1 + width * {2: 3, 6: 4, 0: 1, 4: 2}[colour] * depth // 8
    raw = zlib.decompress(idat)
    return width, height, len({raw[i : i + stride] for i in range(0, len(raw), stride)})


@pytest.mark.slow
def test_the_comparison_page_renders_in_headless_chromium(pages: dict[str, Path], tmp_path: Path) -> None:
    browser = chromium()
    flags = [*CHROME_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    done = subprocess.run(
        [browser, *flags, "--dump-dom", pages["both"].as_uri()], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    errors = re.search(r'<div id="report-errors"[^>]*>(.*?)</div>', dom, re.S)
    assert errors is not None and errors.group(1).strip() == "", errors.group(1) if errors else dom[:500]
    ids = parse(dom)
    drawn = [i for i in parse(pages["both"].read_text()).classes if i.startswith(("fig-", "s1-fig-", "s2-fig-"))]
    assert len(drawn) >= 20 and all("js-plotly-plot" in ids.classes[i] for i in drawn), [
        i for i in drawn if "js-plotly-plot" not in ids.classes[i]
    ]
    legend = re.findall(r'class="(?:legendtext|legendtitletext)"[^>]*>(.*?)</text>', dom)
    assert (
        "pruned (3)" in legend and "complete (11)" in legend and "trial 3" in legend
    )  # the pruning curves' legend, drawn

    shot = Path(os.environ.get("TRM_SWEEPS_KEEP_SCREENSHOT") or tmp_path / "report.png")
    done = subprocess.run(
        [browser, *flags, "--window-size=1400,4000", f"--screenshot={shot}", pages["big"].as_uri()],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0 and shot.stat().st_size > 100_000, done.stderr[-2000:]
    width, height, distinct = png_rows(shot)
    assert (width, height) == (1400, 4000) and distinct > 1000  # figures, not a blank or one-colour page
