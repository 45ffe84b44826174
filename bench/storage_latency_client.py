"""The client side of bench/storage_latency.py: one process that serves phase after phase (its imports paid once),
each a spec line in and a result JSON line out; it times one operation pair through our code path or plain Optuna.
The parent (bench/storage_latency.py) starts it as `python -m bench.storage_latency --client`.
"""

from __future__ import annotations

import json
import random
import sys
import time
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import optuna
from optuna.distributions import FloatDistribution

import storage
from storage.url import driver_url
from sweeps.search.draw import draw_within_budget
from sweeps.search.space import SearchSpace
from trm.links.trial import TrialLink

OBJECTIVE = "eval/exact_accuracy"
PRUNER_SPEC = {
    "_target_": "optuna.pruners.HyperbandPruner",
    "min_resource": 100,
    "max_resource": 500,
    "reduction_factor": 3,
}
WARMUP_OPS = 3


def psycopg2_url(url: str) -> str:
    """SQLAlchemy 2.1 maps postgresql:// to psycopg 3, which is not installed: plain Optuna needs the driver
    spelled out (open_storage does the same internally)."""
    return driver_url(url).render_as_string(hide_password=False)


# One continuous parameter, as a real space has: the driver's duplicate check compares it.
ONE_FLOAT = SearchSpace({"x": FloatDistribution(0.0, 1.0)})


def build_op(spec: dict[str, Any]) -> tuple[Callable[[int], None], optuna.Study]:
    """The op one client repeats (taking its step number) and the study it goes through."""
    name, url, rng = spec["study"], spec["db_url"], random.Random(spec["index"])
    plain = psycopg2_url(url)  # what a user with psycopg2 must write for plain Optuna (see psycopg2_url)
    if spec["operation"] == "report+should_prune":
        if spec["setup"] == "ours":
            link = TrialLink(name, spec["trial_number"], url)
            assert link.objective == OBJECTIVE and isinstance(link.study.pruner, optuna.pruners.HyperbandPruner)

            def report_ours(step: int) -> None:
                assert link.report(step, {OBJECTIVE: rng.random()}) != "abandon", "the trial is RUNNING"

            return report_ours, link.study
        hyperband = optuna.pruners.HyperbandPruner(min_resource=100, max_resource=500, reduction_factor=3)
        study = optuna.load_study(study_name=name, storage=plain, pruner=hyperband)
        trial = optuna.trial.Trial(
            study, study._storage.get_trial_id_from_study_id_trial_number(study._study_id, spec["trial_number"])
        )

        def report_defaults(step: int) -> None:
            trial.report(rng.random(), step)
            trial.should_prune()

        return report_defaults, study
    sampler = optuna.samplers.RandomSampler(seed=spec["index"])
    if spec["setup"] == "ours":
        rdb = storage.open_storage(
            url, heartbeat_interval=5, grace_period=30, failed_trial_callback=storage.retry_callback(2)
        )
        study = optuna.load_study(study_name=name, storage=rdb, sampler=sampler)
        # The driver's own draw (sweeps/search/draw.py), with a budget never reached: every ask goes through.
        ask = partial(draw_within_budget, study, rdb, ONE_FLOAT, 10**9)
    else:
        study = optuna.load_study(study_name=name, storage=plain, sampler=sampler)
        ask = study.ask
    if spec["setup"] == "ours":
        return (lambda step: study.tell(ask().trial, rng.random())), study
    return (lambda step: study.tell(ask(), rng.random())), study


def run_phase_client(spec: dict[str, Any]) -> dict[str, Any]:
    """One phase in a client: connect, warm up, "ready", wait for "go", timed ops; then close its connections."""
    op, study = build_op(spec)
    stride = max(1, PRUNER_SPEC["max_resource"] // (WARMUP_OPS + spec["ops"]))  # steps stay in the pruner's range
    for i in range(WARMUP_OPS):
        op((i + 1) * stride)
    print("ready", flush=True)
    sys.stdin.readline()
    latencies, start = [], time.monotonic()  # CLOCK_MONOTONIC is system-wide: spans compare across clients
    for i in range(WARMUP_OPS, WARMUP_OPS + spec["ops"]):
        t0 = time.perf_counter()
        op((i + 1) * stride)
        latencies.append(time.perf_counter() - t0)
    end = time.monotonic()
    cached = study._storage
    backend = getattr(cached, "_backend", cached)
    pool = backend.engine.pool
    result = {
        "latencies_s": latencies, "start": start, "end": end, "pool_open": pool.checkedin() + pool.checkedout(),
        "storage_class": f"{type(cached).__name__}({type(backend).__name__})", "torch_imported": "torch" in sys.modules,
    }  # fmt: skip
    storage.close_storage(backend)  # the next phase in this process starts without idle connections
    return result


def run_client() -> None:
    """A client process serving phase after phase (imports paid once): spec line in, result JSON line out."""
    warnings.filterwarnings("ignore")  # experimental/heartbeat warnings on every ask: noise here, as in the driver
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    while line := sys.stdin.readline():
        print(json.dumps(run_phase_client(json.loads(line))), flush=True)
