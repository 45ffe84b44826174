"""First-step time of a trial on XLA with no compile cache, a cold one and a warm one (`runtime.compile_cache_dir`).

    PJRT_DEVICE=CPU .venv-xla/bin/python -m bench.xla_compile_cache      # 3 rounds, medians

Each round uses a fresh cache directory and starts three trials, each its own process (tests/xla/_worker.py: the
real train step, tiny model, 3 steps, EMA): `off` (no cache), `cold` (empty cache: compiles and writes) and `warm`
(the same shapes, another lr, weight decay, betas and EMA decay: every graph is found in the cache). Reported: the
first step's time (its graph compiled and run), the first two steps' (the second is the first with optimizer
state: a second graph), and the persistent-cache counters. XLA on this CPU, not TPU: PJRT's CPU client cannot
load a cached executable (each found entry counts PersistentCacheDeserializeFailure and is compiled again), so on
CPU `warm` shows the graphs are the same (zero misses) but not the saving a TPU gets from loading them.
JSON + table go to bench/results/xla_compile_cache.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench._results import ROOT, fmt, median, run_header, write_results
from sweeps.testing import LAUNCHER_ENV

WORKER = ROOT / "tests" / "xla" / "_worker.py"  # the XLA lane's step worker, run as a script

BASE = ["--steps", "3", "--ema", "--exploration", "0.3", "runtime.backend=xla"]
OTHER = ["optim.lr=2.3e-3", "optim.weight_decay=0.37", "optim.betas=[0.9,0.99]", "optim.ema_decay=0.95"]
KEYS = ("UncachedCompile", "PersistentCacheMiss", "PersistentCacheHit", "PersistentCacheDeserializeFailure")


def trial(args: list[str], devices: int, xla_flags: str) -> dict[str, Any]:
    """One trial in a fresh process; its per-step seconds and final counters."""
    import torch  # the worker's output is a torch file; torch is in the venv this runs in

    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    env.update(PJRT_DEVICE="CPU", PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2", CPU_NUM_DEVICES=str(devices))
    if xla_flags:
        env["XLA_FLAGS"] = xla_flags
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.pt"
        proc = subprocess.run(
            [sys.executable, str(WORKER), str(out), *args], cwd=ROOT, env=env, capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise SystemExit(f"worker failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        records = torch.load(out, weights_only=False)["info"]["records"]
    return {
        "step_seconds": [r["seconds"] for r in records],
        "counters": {k: records[-1]["counters"][k] for k in KEYS},
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--devices", type=int, default=1, help="virtual XLA CPU devices (SPMD mesh)")
    p.add_argument("--xla-flags", default="", help="XLA_FLAGS for the trials (default: XLA's own optimization)")
    args = p.parse_args(argv)
    result = run_header("xla_compile_cache", argv)
    result.update(rounds=args.rounds, devices=args.devices, xla_flags=args.xla_flags, warm_overrides=OTHER)
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "cold": [], "warm": []}
    for rnd in range(args.rounds):
        with tempfile.TemporaryDirectory() as cache:
            cached = [f"runtime.compile_cache_dir={cache}"]
            runs["off"].append(trial(BASE, args.devices, args.xla_flags))
            runs["cold"].append(trial([*BASE, *cached], args.devices, args.xla_flags))
            runs["warm"].append(trial([*BASE, *cached, *OTHER], args.devices, args.xla_flags))
        print(
            f"round {rnd + 1}/{args.rounds}: "
            + ", ".join(f"{k} {v[-1]['step_seconds'][0]:.2f} s" for k, v in runs.items())
        )
    result["runs"] = runs
    summary = {}
    for name, trials in runs.items():
        summary[name] = {
            "first_step_s": median([t["step_seconds"][0] for t in trials]),
            "first_two_steps_s": median([sum(t["step_seconds"][:2]) for t in trials]),
            "steady_step_s": median([t["step_seconds"][-1] for t in trials]),
            **{k: median([t["counters"][k] for t in trials]) for k in KEYS},
        }
    result["summary"] = summary
    machine = result["machine"]
    lines = [
        f"XLA on CPU ({machine['cpu_model']}, {machine['usable_cores']} usable cores, load {machine['loadavg']}), "
        f"not TPU; tiny model, {args.devices} device(s), medians of {args.rounds} rounds.",
        "",
        "| cache | first step (s) | first two steps (s) | later step (s) | compiles | cache misses | found, not loadable (CPU) | hits |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in summary.items():
        lines.append(
            f"| {name} | {fmt(s['first_step_s'])} | {fmt(s['first_two_steps_s'])} | {fmt(s['steady_step_s'], '.3f')} | "
            f"{fmt(s['UncachedCompile'], '.0f')} | {fmt(s['PersistentCacheMiss'], '.0f')} | "
            f"{fmt(s['PersistentCacheDeserializeFailure'], '.0f')} | {fmt(s['PersistentCacheHit'], '.0f')} |"
        )
    write_results("xla_compile_cache", result, "\n".join(lines))


if __name__ == "__main__":
    main()
