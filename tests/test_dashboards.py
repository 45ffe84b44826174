"""Dashboards on the real PostgreSQL: optuna-dashboard served over HTTP, and the HTML report rendered in Chromium."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from dashboards import report, serve
from storage import close_storage, open_storage
from sweeps.config.typed_config import typed_sweep
from sweeps.driver import Driver
from sweeps.launchers.torchrun import free_port
from tests import prereqs
from tests.sweep_helpers import FAST_TRIAL, sweep_config

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_HINT = "install it with `apt-get install -y chromium` (Debian's package; the tests never download a browser)"
# A single-objective study (no Pareto front) whose trials' metrics files are not on this machine (no fig-curves)
ALL_FIGURES = [f for f in report.FIGURES if f not in ("fig-pareto-front", "fig-curves")]

SPACE = {
    "optim": CategoricalDistribution(["adam_atan2", "adamw", "lion"]),
    "optim.lr@lion": FloatDistribution(3e-5, 3e-4, log=True),
    "arch.hidden_size": CategoricalDistribution([16, 32, 64]),
    "curriculum.enabled": CategoricalDistribution([True, False]),
    "curriculum.end_fraction": FloatDistribution(0.2, 0.8),
    "halting.exploration_prob": FloatDistribution(0.0, 0.5),
    "arch.halt_max_steps": IntDistribution(2, 6),
}


def fill_study(study: optuna.Study, n: int = 16, seed: int = 0) -> None:
    """Trials as the driver and the jobs record them: pruning curves, model size, compute, seeds; some pruned."""
    rng = random.Random(seed)
    study.set_user_attr("objective", "eval/exact_accuracy")
    for i in range(n):
        space = {k: v for k, v in SPACE.items() if "@" not in k}
        trial = study.ask(space)
        if trial.params["optim"] == "lion":
            trial.suggest_float("optim.lr@lion", 3e-5, 3e-4, log=True)
        hidden = trial.params["arch.hidden_size"]
        accuracy = 0.2 + 0.3 * hidden / 64 + 0.1 * rng.random()
        for step in (10, 20, 30):
            trial.report(accuracy * step / 30, step)
        params = 20 * hidden * hidden
        trial.set_user_attr("params_count", params)
        trial.set_user_attr("compute_flops", params * 6 * 30 * trial.params["arch.halt_max_steps"])
        trial.set_user_attr("best_step", 30)
        if i % 4 == 3:
            study.tell(trial, state=TrialState.PRUNED)
            continue
        if i % 3 == 0:
            trial.set_user_attr("seed_values", [accuracy - 0.02, accuracy + 0.03, accuracy])
        study.tell(trial, accuracy)


@pytest.fixture(scope="module")
def studies(pg_url: str) -> dict[str, str]:
    """Three studies in the session's database: a full one, a bare one, a multi-objective one."""
    storage = open_storage(pg_url)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    full = optuna.create_study(study_name="dash_full", storage=storage, direction="maximize")
    fill_study(full)
    bare = optuna.create_study(study_name="dash_bare", storage=storage, direction="maximize")
    trial = bare.ask({"arch.L_layers": IntDistribution(1, 2)})
    bare.tell(trial, 0.5)
    multi = optuna.create_study(study_name="dash_pareto", storage=storage, directions=["maximize", "minimize"])
    multi.set_user_attr("objectives", ["eval/exact_accuracy", "compute_flops"])
    for i in range(4):
        trial = multi.ask({"arch.hidden_size": CategoricalDistribution([16, 32, 64])})
        trial.set_user_attr("params_count", 20 * trial.params["arch.hidden_size"] ** 2)
        trial.set_user_attr("compute_flops", 1e6 * trial.params["arch.hidden_size"])
        multi.tell(trial, [0.1 * i, 1e6 * trial.params["arch.hidden_size"]])
    close_storage(storage)
    return {"full": "dash_full", "bare": "dash_bare", "multi": "dash_pareto"}


def wait_for_json(url: str, proc: subprocess.Popen, timeout: float = 60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return json.loads(response.read())
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"no answer from {url} within {timeout} s")


def start_server(pg_url: str, *extra: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    argv = [sys.executable, "-m", "dashboards.serve", f"storage.url={pg_url}", f"port={port}", *extra]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, port


def stop(proc: subprocess.Popen) -> tuple[str, str]:
    proc.terminate()
    try:
        return proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


# --------------------------------------------------------------------------------------------- serve


@pytest.mark.slow
def test_dashboard_serves_our_studies_from_postgres(pg_url: str, studies: dict[str, str]) -> None:
    local, local_port = start_server(pg_url)
    remote, remote_port = start_server(pg_url, "host=0.0.0.0", "allow_remote=true")
    try:
        answer = wait_for_json(f"http://127.0.0.1:{local_port}/api/studies", local)
        by_name = {s["study_name"]: s for s in answer["study_summaries"]}
        assert set(studies.values()) <= set(by_name)
        assert by_name["dash_pareto"]["directions"] == ["maximize", "minimize"]
        full = optuna.load_study(study_name="dash_full", storage=open_storage(pg_url))
        detail = wait_for_json(
            f"http://127.0.0.1:{local_port}/api/studies/{by_name['dash_full']['study_id']}?after=0", local
        )
        assert len(detail["trials"]) == len(full.trials) and detail["has_intermediate_values"]
        assert detail["best_trials"][0]["values"] == [pytest.approx(full.best_value)]
        # the allow_remote server answers too (on every interface)
        remote_answer = wait_for_json(f"http://127.0.0.1:{remote_port}/api/studies", remote)
        assert {s["study_name"] for s in remote_answer["study_summaries"]} == set(by_name)
    finally:
        local_out, local_err = stop(local)
        _, remote_err = stop(remote)
    assert f"127.0.0.1:{local_port}" in local_out and "no authentication" not in local_err
    assert "warning" in remote_err and "no authentication" in remote_err and "delete" in remote_err


@pytest.mark.slow
def test_non_loopback_host_needs_allow_remote() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dashboards.serve", "host=0.0.0.0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "allow_remote=true" in done.stderr and "host='0.0.0.0'" in done.stderr and "no authentication" in done.stderr
    assert done.stdout == ""
    for host in ("192.0.2.10", "::", "example.invalid"):
        refusal = serve.check_bind(host, allow_remote=False)
        assert refusal is not None and "allow_remote=true" in refusal and repr(host) in refusal
        assert serve.check_bind(host, allow_remote=True) is None
    assert serve.check_bind("127.0.0.1", allow_remote=False) is None


def test_loopback_detection_and_bad_arguments(capsys: pytest.CaptureFixture) -> None:
    assert (
        serve.is_loopback("127.0.0.1")
        and serve.is_loopback("localhost")
        and serve.is_loopback("::1")
        and serve.is_loopback("127.0.1.1")
    )
    assert not serve.is_loopback("0.0.0.0") and not serve.is_loopback("10.1.2.3") and not serve.is_loopback("::")
    assert serve.main(["allow_remote=maybe"]) == 2 and "allow_remote='maybe'" in capsys.readouterr().err
    assert serve.main(["prot=8080"]) == 2 and "'prot'" in capsys.readouterr().err
    assert serve.main(["port=http"]) == 2 and "port='http'" in capsys.readouterr().err


# -------------------------------------------------------------------------------------------- report


class Ids(HTMLParser):
    """Element ids and classes of an HTML document, and the notes left for figures that do not apply."""

    def __init__(self) -> None:
        super().__init__()
        self.classes: dict[str, str] = {}
        self.notes: set[str] = set()
        self.external: list[str] = []  # resources the page would fetch

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag in ("script", "img", "iframe") and a.get("src") or tag == "link" and a.get("href"):
            self.external.append(a.get("src") or a.get("href") or "")
        if a.get("id"):
            self.classes[a["id"]] = a.get("class") or ""
        if "note" in (a.get("class") or "").split() and a.get("data-figure"):
            self.notes.add(a["data-figure"])


def parse(text: str) -> Ids:
    ids = Ids()
    ids.feed(text)
    return ids


@pytest.fixture(scope="module")
def full_report(pg_url: str, studies: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report") / "full.html"
    assert report.main([f"study={studies['full']}", f"storage.url={pg_url}", f"out={out}"]) == 0
    return out


@pytest.mark.slow
def test_report_has_every_figure_once_with_plotly_inlined(full_report: Path) -> None:
    text = full_report.read_text()
    ids = parse(text)
    for fig_id in ALL_FIGURES:
        assert fig_id in ids.classes, fig_id
        assert len(re.findall(rf'Plotly\.newPlot\(\s*"{fig_id}"', text)) == 1, fig_id
    assert "fig-pareto-front" not in ids.classes and "fig-pareto-front" in ids.notes
    assert ids.external == []  # self-contained: nothing is fetched
    assert text.count(report.get_plotlyjs()[:200]) == 1  # the library once, not per figure
    assert 'id="report-errors"' in text and 'id="trials"' in text
    # A figure that raises becomes a note instead of a failed report: none may here (a str + tuple slipped
    # through that way once, in the note of a study without metrics files).
    assert "Could not be drawn" not in text


@pytest.mark.slow
def test_report_leaves_out_what_does_not_apply(
    pg_url: str, studies: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "bare.html"
    assert report.main([f"study={studies['bare']}", f"storage.url={pg_url}", f"out={out}"]) == 0
    ids = parse(out.read_text())
    present = {"fig-optimization-history", "fig-parallel-coordinate", "fig-slice"}
    assert present <= set(ids.classes)
    absent = set(report.FIGURES) - present
    assert not absent & set(ids.classes) and ids.notes == absent  # each one left out with a note

    out = tmp_path / "multi.html"
    assert report.main([f"study={studies['multi']}", f"storage.url={pg_url}", f"out={out}"]) == 0
    ids = parse(out.read_text())
    assert {"fig-pareto-front", "fig-accuracy-vs-params", "fig-accuracy-vs-compute", "fig-optimization-history"} <= set(
        ids.classes
    )

    capsys.readouterr()
    assert report.main(["study=no_such_study", f"storage.url={pg_url}", f"out={tmp_path / 'x.html'}"]) == 2
    err = capsys.readouterr().err
    assert "study='no_such_study' not found" in err and "dash_full" in err
    assert report.main([f"storage.url={pg_url}"]) == 2 and "study=NAME is required" in capsys.readouterr().err


def chromium() -> str:
    for name in prereqs.BROWSERS:  # the ones `make test` checks for (and installs) before the suite
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(f"Chromium is needed to check that the report renders: {CHROMIUM_HINT}", pytrace=False)


def test_missing_chromium_fails_with_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(pytest.fail.Exception, match=r"apt-get install -y chromium"):
        chromium()


CHROME_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-extensions", "--hide-scrollbars", "--virtual-time-budget=15000",
]  # fmt: skip


@pytest.mark.slow
def test_report_renders_in_headless_chromium_without_script_errors(full_report: Path, tmp_path: Path) -> None:
    browser = chromium()
    flags = [*CHROME_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    done = subprocess.run(
        [browser, *flags, "--dump-dom", full_report.as_uri()], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    ids = parse(dom)
    errors = re.search(r'<div id="report-errors"[^>]*>(.*?)</div>', dom, re.S)
    assert errors is not None and errors.group(1).strip() == "", errors.group(1) if errors else dom[:500]
    for fig_id in ALL_FIGURES:  # plotly drew every figure (it marks the div and adds its SVG layers)
        assert "js-plotly-plot" in ids.classes.get(fig_id, ""), fig_id
    assert dom.count('class="main-svg"') >= 2 * len(ALL_FIGURES)

    # One screenshot, to look at the layout by eye (kept under the test's tmp dir)
    shot = tmp_path / "report.png"
    done = subprocess.run(
        [browser, *flags, "--window-size=1400,4000", f"--screenshot={shot}", full_report.as_uri()],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0 and shot.stat().st_size > 50_000, done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("TRM_SWEEPS_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["TRM_SWEEPS_KEEP_SCREENSHOT"])


@pytest.mark.slow
def test_report_of_a_real_sweep(pg_url: str, tmp_path: Path) -> None:
    """One real trial (the optimizer study's baseline): the report reads what the job and driver recorded."""
    study = Driver(
        typed_sweep(
            sweep_config(pg_url, tmp_path, "study=optimizer", "study.name=dash_real", "n_trials=1", trial=FAST_TRIAL)
        )
    ).run()
    trial = study.trials[0]
    assert trial.state == TrialState.COMPLETE and trial.user_attrs["params_count"] > 0
    out = tmp_path / "real.html"
    assert report.main(["study=dash_real", f"storage.url={pg_url}", f"out={out}"]) == 0
    ids = parse(out.read_text())
    drawn = {"fig-optimization-history", "fig-parallel-coordinate", "fig-intermediate-values", "fig-curves", "fig-slice",
             "fig-accuracy-vs-params", "fig-accuracy-vs-compute", "fig-accuracy-by-optimizer"}  # fmt: skip
    assert drawn <= set(ids.classes)
    assert ids.notes >= {"fig-param-importances", "fig-curriculum", "fig-halting", "fig-seed-spread"}
    assert not ids.notes & drawn  # captions are not notes
    # the job's metrics file (its workdir's run/metrics.jsonl) gives the train and eval curves; its timing the time axes
    curves = {s.fig_id: s for s in report.build_sections(report.StudyView(study))}["fig-curves"].figure
    assert {"train/lm_loss", "eval/exact_accuracy"} <= {t.legendgroup.split("|")[0] for t in curves.data}
    assert [b.label for b in curves.layout.updatemenus[0].buttons] == ["training step", "wall-clock"]
