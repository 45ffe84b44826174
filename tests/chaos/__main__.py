"""The long soak (`make soak`): the chaos suite's study at its full size, faults at random points (seeded), every
invariant checked; prints what each fault did and what recovered it, and exits 1 if any invariant fails (the
study's files and driver logs are kept then).

    python -m tests.chaos                           # 20 trials, 2 drivers, a private PostgreSQL (~10-15 min here)
    python -m tests.chaos --trials 40 --job-kills 4 --job-stops 2 --driver-kills 2 --pg-restarts 2 --seed 7
    python -m tests.chaos --pg-url postgresql://postgres@127.0.0.1:5433/trm_sweeps   # no PostgreSQL restart then
    python -m tests.chaos --pod --shape v4-32 --minutes 30   # the pod soak (tests/chaos/pod_soak.py)
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

from bench._results import cpu_facts
from tests.chaos import invariants, report
from tests.chaos.faults import parse_schedule, random_schedule
from tests.chaos.injector import run_study
from tests.chaos.postgres import PrivatePostgres
from tests.chaos.record import StudyRecord
from tests.chaos.settings import SoakSettings


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=20, help="the study's n_trials")
    p.add_argument("--drivers", type=int, default=2)
    p.add_argument("--max-concurrent", type=int, default=1, help="trials at once per driver")
    p.add_argument("--seed", type=int, default=1, help="the sweep's seed and the fault schedule's")
    p.add_argument("--steps", type=int, default=40, help="training steps per trial (eval and checkpoint every 10)")
    p.add_argument("--pruner", default="hyperband", help="conf/pruner/ name (min_resource: one eval interval)")
    p.add_argument(
        "--stall-timeout-s",
        type=int,
        default=45,
        help="the driver's stall_timeout_s (above a trial's start-up here: up to ~25 s on a loaded 2-core machine)",
    )
    p.add_argument("--grace-s", type=int, default=5, help="heartbeat.grace_s (the interval is 1 s)")
    p.add_argument("--job-kills", type=int, default=2, help="SIGKILLs of a running training job")
    p.add_argument("--job-stops", type=int, default=1, help="SIGSTOPs of a running training job (past the stall limit)")
    p.add_argument(
        "--driver-kills", type=int, default=1, help="SIGKILLs of a driver, each started again with the same arguments"
    )
    p.add_argument("--pg-restarts", type=int, default=1, help="PostgreSQL stops/starts (private cluster only)")
    p.add_argument(
        "--faults",
        help="a fixed schedule instead of the random one: kind@starts[+delay_s][:min_step],... where the fault "
        "is due once `starts` jobs were launched, `delay_s` after that (and after the previous fault), on a job "
        "that logged `min_step`; e.g. stop_job@2:10,restart_pg@2+48",
    )
    p.add_argument("--pg-down-s", type=float, default=10.0, help="how long PostgreSQL stays down")
    p.add_argument(
        "--pg-url", help="use this PostgreSQL database instead of a private cluster (then no restart is injected)"
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        help="the study's trial directories and logs (default: a new directory in /tmp; "
        "removed after a passing run unless --keep)",
    )
    p.add_argument("--keep", action="store_true", help="keep the work directory after a passing run")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="give up (and fail) after this long")
    p.add_argument("--out-dir", type=Path, help="write soak.json (everything) and soak.md (the table) here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if "--pod" in given:  # the pod soak: a study on the stand-in gcloud's slice (tests/chaos/pod_soak.py)
        from tests.chaos.pod_soak import main as pod_main

        return pod_main([a for a in given if a != "--pod"])
    args = parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="trm-soak-", dir="/tmp"))
    settings = SoakSettings(
        work=work,
        n_trials=args.trials,
        drivers=args.drivers,
        max_concurrent=args.max_concurrent,
        seed=args.seed,
        train_steps=args.steps,
        stall_timeout_s=args.stall_timeout_s,
        grace_s=args.grace_s,
        pruner=args.pruner,
        pg_down_s=args.pg_down_s,
        timeout_s=args.timeout_s,
    )
    rng = random.Random(args.seed)
    counts = {
        "kill_job": args.job_kills,
        "stop_job": args.job_stops,
        "kill_driver": args.driver_kills,
        "restart_pg": 0 if args.pg_url else args.pg_restarts,
    }
    if args.pg_url and args.pg_restarts:
        print("--pg-url: no PostgreSQL restart is injected (only a private cluster is ever stopped)")
    faults = parse_schedule(args.faults) if args.faults else random_schedule(rng, settings, counts)
    if args.pg_url:
        faults = [f for f in faults if f.kind != "restart_pg"]
        soaked = run_study(settings, faults, args.pg_url, rng=rng)
        record = StudyRecord.load(args.pg_url, settings.study)
    else:
        with PrivatePostgres() as pg:
            soaked = run_study(settings, faults, pg.url, pg=pg, rng=rng)
            record = StudyRecord.load(pg.url, settings.study)
    result = report.summarize(soaked, record, invariants.check_all(soaked, record))
    print(result["table"])
    if args.out_dir is not None:
        command = " ".join(["python -m tests.chaos", *(sys.argv[1:] if argv is None else argv)])
        result = {"command": command, "machine": cpu_facts(), **result, "work_dir": str(work)}
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / "soak.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
        (args.out_dir / "soak.md").write_text(result["table"] + "\n")
    if result["ok"] and not args.keep and args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"study files and driver logs: {work}")
    if not result["ok"]:
        print(report.log_tails(soaked.runs))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
