"""The pod soak (issue 56, Done when; `make soak-pod`): a `sweeps.run` study with the tpu_pod launcher on the
stand-in gcloud's slice (tests/fake_gcloud: each VM a directory, its jobs real processes), checkpoints in the
gs:// stand-in (tests/fake_gcs.py), for `--minutes` under the faults of tests/chaos/pod_faults.py; then the
invariants of tests/chaos/pod_invariants.py, written to bench/results/pod_soak_<shape>.json (and .md).

    python -m tests.chaos --pod --shape v4-32 --minutes 30      # ~31 min here
    python -m tests.chaos --pod --shape v5litepod-16 --minutes 30 --seed 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from bench._results import run_header
from sweeps.launchers.torchrun import free_port
from sweeps.launchers.tpu.slice import shape_of_type
from sweeps.testing import FAST_TRIAL, LAUNCHER_ENV, sweep_overrides
from tests.chaos import pod_invariants as checks
from tests.chaos.pod_faults import FAKE_GCLOUD, POD_FAULT_KINDS, PodFault, PodHand, PodSoakSettings, pod_schedule
from tests.chaos.postgres import ROOT, PrivatePostgres
from tests.chaos.record import StudyRecord
from tests.chaos.report import trial_row

VM_SITE = FAKE_GCLOUD.parent / "vm-site"
CHIPS_GLOB = {"v4": "~/dev/accel*"}  # the stand-in VM's chips (under its HOME); other families: VFIO groups
STUDY = "halting"


def slice_workers(shape: str) -> int:
    """The stand-in's VM count for `shape` (what `tpu-vm describe` lists), from the stand-in itself."""
    out = subprocess.run(
        [str(FAKE_GCLOUD), "compute", "tpus", "tpu-vm", "describe", "probe", "--zone=z", "--format=json"],
        env={**os.environ, "FAKE_TPU_ROOT": tempfile.mkdtemp(prefix="trm-pod-probe-"), "FAKE_TPU_TYPE": shape},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return len(json.loads(out.stdout)["networkEndpoints"])


def pod_env(s: PodSoakSettings) -> dict[str, str]:
    """The driver's environment: the stand-in slice and store, its API's error rate, this checkout first."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV and not k.startswith("FAKE_")}
    env.update(
        FAKE_TPU_ROOT=str(s.pod_root),
        FAKE_TPU_TYPE=s.shape,
        FAKE_GCS_ROOT=str(s.gcs_root),  # the VMs' gs:// (vm-site) and the driver's (PYTHONPATH below)
        FAKE_TPU_DESCRIBE_ERROR_RATE=str(s.describe_error_rate),
        FAKE_TPU_DESCRIBE_SEED=str(s.seed),
        FAKE_TPU_DESCRIBE_LATENCY_S="0.3",
        FAKE_TPU_STALE_DESCRIBES="1",  # the API's view lags a preemption by one describe
        FAKE_TPU_RECREATE_SSH_S="10",  # a recreated slice is READY before its VMs' sshd answers
        FAKE_TPU_TCP_TIMEOUT_S=str(s.tcp_timeout_s),
        FAKE_TPU_PREEMPT_NOTICE_S="0",  # the hand's preemption sets its own notice
        FAKE_GCLOUD_RETRY_S="1",  # gcloud's 5 s between attempts on ssh's 255
        FAKE_TPU_VM_ENVIRONMENT="OMP_WAIT_POLICY",
        OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
        PYTHONPATH=os.pathsep.join([str(ROOT), str(VM_SITE)]),
    )
    return env


def vm_setup_script(s: PodSoakSettings) -> Path:
    """launcher.setup's script, run on every VM by each prepare (a recreated VM is bare): the VM's venv, here a
    wrapper of this interpreter that imports this checkout (the one the driver runs)."""
    script = s.work / "vm-setup.sh"
    python = f'#!/bin/sh\nPYTHONPATH={ROOT}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} "$@"\n'
    script.write_text(
        "mkdir -p ~/venv/bin\ncat > ~/venv/bin/python <<'EOF'\n" + python + "EOF\nchmod +x ~/venv/bin/python\n"
    )
    return script


def global_batch(shape: str) -> int:
    """test_tiny's global batch, raised to a multiple of the slice's chips (the driver refuses a batch the chips do
    not divide): 16 on a 16-chip v4-32 or v5litepod-16, 32 on the 8-VM v4-64 the seeds plan."""
    chips = shape_of_type("soak", shape).chips
    return math.lcm(int(OmegaConf.load(ROOT / "conf" / "experiment" / "test_tiny.yaml").train.global_batch_size), chips)


def driver_argv(s: PodSoakSettings, url: str) -> list[str]:
    trial = [o for o in FAST_TRIAL if not o.startswith(("train.steps", "train.log_interval", "train.eval_interval"))]
    trial += [
        f"train.global_batch_size={global_batch(s.shape)}",
        f"train.steps={s.train_steps}",
        f"train.log_interval={s.eval_interval}",
        f"train.eval_interval={s.eval_interval}",
        "train.preemption_check_interval=1",
        "runtime.backend=torch",
        f"runtime.port={free_port()}",
    ]
    family = s.shape.partition("-")[0]
    pod = {
        "site": "pod",
        "study": STUDY,
        "scale": "tiny",  # the study's tiny space: the trials are test_tiny's model
        "storage": "postgres",
        "launcher.tpu_name": s.tpu,
        "launcher.zone": "us-central2-b",
        "launcher.gcloud": str(FAKE_GCLOUD),
        "launcher.python": "'~/venv/bin/python'",
        "launcher.remote_dir": "'~/trm'",
        "launcher.env": "{}",
        "launcher.setup": f"'sh {vm_setup_script(s)}'",
        "launcher.state_poll_s": "3",
        "launcher.describe_backoff_s": "1",
        "launcher.ssh_timeout_s": "60",
        "launcher.kill_grace_s": "30",
        "launcher.recover_timeout_s": "900",
        "launcher.ssh_alive_interval_s": str(s.ssh_alive_interval_s),
        "launcher.ssh_alive_count": "3",
        "trial.checkpoint_root": "gs://bucket/ckpt",
        "n_trials": str(s.n_trials),  # the soak's 10000: it ends by its timeout, no trial starts after --minutes
        "timeout": str(int(s.minutes * 60)),
        "seed": str(s.seed),
        "stall_timeout_s": "300",
        "heartbeat.interval_s": "2",
        "heartbeat.grace_s": "60",
        "heartbeat.max_retry": "2",
        "poll_s": "0.5",
        "progress_interval_s": "60",
        "wandb.summary": "false",
        "preflight.expect": f"{{torch: '{torch.__version__}', torch_xla: null}}",
        "preflight.chips_glob": f"'{CHIPS_GLOB.get(family, '~/dev/vfio/[0-9]*')}'",
        "preflight.min_free_gb": "0",
        "hydra.run.dir": str(s.work / "hydra"),
    }
    argv = [a for a in sweep_overrides(url, s.output_root, trial=trial) if a.split("=", 1)[0] not in pod]
    return [*argv, *(f"{k}={v}" for k, v in pod.items())]


def settle_processes(s: PodSoakSettings, wait_s: float = 20.0) -> list[dict[str, object]]:
    """The soak's processes still alive `wait_s` after the driver exited (a gcloud's TPU runtime stand-in polls
    its parent every 0.2 s); each then SIGKILLed by its id, so that no leftover outlives the soak."""
    markers = [s.tpu, str(s.output_root)]  # the driver's and gcloud's command lines; the trials' directories
    deadline = time.monotonic() + wait_s
    while (left := checks.soak_processes(markers, str(s.pod_root))) and time.monotonic() < deadline:
        time.sleep(1)
    for p in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(str(p["pid"])), 9)
    return left


def run_soak(s: PodSoakSettings, url: str, faults: list[PodFault] | None = None) -> dict[str, Any]:
    """The study, the faults (`faults`, else drawn from the seed: pod_schedule), the checks; everything as one
    result."""
    for path in (s.pod_root, s.gcs_root / "bucket", s.output_root):
        path.mkdir(parents=True, exist_ok=True)
    rng = random.Random(s.seed)
    workers = slice_workers(s.shape)
    faults = pod_schedule(rng, s, workers) if faults is None else faults
    env = pod_env(s)
    log = s.work / "driver.log"
    t0 = time.monotonic()
    with open(log, "w") as out:
        driver = subprocess.Popen(
            [sys.executable, "-m", "sweeps.run", *driver_argv(s, url)], cwd=ROOT, env=env, stdout=out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    hand = PodHand(s, faults, env, t0)
    thread = threading.Thread(target=hand.run, daemon=True)
    thread.start()
    limit_s = s.minutes * 60 * 2 + 900  # a study that has not ended by then is stuck
    try:
        returncode: int | None = driver.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        driver.kill()
        driver.wait()
        returncode = None
    wall_s = time.monotonic() - t0
    hand.stopped = True
    thread.join(timeout=600)
    leftover = settle_processes(s)
    record = StudyRecord.load(url, STUDY)
    verdicts = [
        checks.driver_ended(returncode, limit_s),
        checks.pod_faults_injected(faults),
        checks.every_configuration_trained(record),
        checks.no_retry_on_infrastructure(record),
        checks.no_orphan_process(leftover),
        checks.no_checkpoint_lost(record, s.eval_interval),
    ]
    describe_log = s.pod_root / "describe.log"
    admin_log = s.pod_root / "admin.log"
    driver_lines = log.read_text(errors="replace").splitlines()
    result: dict[str, Any] = {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(s).items()},
        "vms": workers,
        "wall_s": round(wall_s, 1),
        "driver_exit": returncode,
        "describes": len(describe_log.read_text().splitlines()) if describe_log.exists() else 0,
        "describe_errors_given": describe_errors_given(s, describe_log),
        "describe_warnings": sum("could not be described" in line for line in driver_lines),
        "faults": [asdict(f) for f in faults],
        "admin_log": admin_log.read_text().splitlines() if admin_log.exists() else [],
        "leftover_processes": leftover,
        "checks": [{"check": c.name, "ok": c.ok, "detail": c.detail} for c in verdicts],
        "trials": [trial_row(t, record.chain) for t in record.trials],
        "driver_log_tail": driver_lines[-40:],
        "ok": all(c.ok for c in verdicts),
    }
    result["table"] = markdown(result)
    return result


def describe_errors_given(s: PodSoakSettings, describe_log: Path) -> int:
    """How many of the study's describes the stand-in answered with a 503 or 429: its draw for call n (n lines in
    describe.log, this call's included) is random.Random(f"{seed}-{n}") below the rate (tests/fake_gcloud/gcloud,
    next_fault)."""
    calls = len(describe_log.read_text().splitlines()) if describe_log.exists() else 0
    return sum(random.Random(f"{s.seed}-{n}").random() < s.describe_error_rate for n in range(1, calls + 1))


def markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    states = [t["state"] for t in result["trials"]]
    lines = [
        f"Pod soak: {s['shape']} ({result['vms']} VMs) on the stand-in gcloud, {s['minutes']:g} min study, "
        f"{s['train_steps']}-step trials (a save every {s['eval_interval']}), seed {s['seed']}; {result['wall_s']:.0f} s "
        f"wall; {len(states)} attempts ({', '.join(f'{k} {states.count(k)}' for k in sorted(set(states)))}); "
        f"{result['describes']} describes, {result['describe_errors_given']} answered 503/429 "
        f"({s['describe_error_rate']:.0%} drawn), {result['describe_warnings']} gave up on",
        "",
        "| fault | worker | trial training then | at (s) | healed (s) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for f in result["faults"]:
        at = "-" if f["injected_at_s"] is None else f"{f['injected_at_s']:.0f}"
        healed = "-" if f["healed_at_s"] is None else f"{f['healed_at_s']:.0f}"
        lines.append(f"| {f['kind']} | {f['worker']} | {f['trial'] or '-'} | {at} | {healed} |")
    lines += ["", "| check | ok | detail |", "| --- | --- | --- |"]
    lines += [f"| {c['check']} | {'yes' if c['ok'] else '**NO**'} | {c['detail']} |" for c in result["checks"]]
    return "\n".join([*lines, "", f"**{'PASS' if result['ok'] else 'FAIL'}**"])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.chaos --pod", description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="v4-32", help="the stand-in slice's accelerator type (v4-32, v5litepod-16)")
    p.add_argument("--minutes", type=float, default=30.0, help="the study's length (no trial starts after it)")
    p.add_argument("--seed", type=int, default=1, help="the sweep's, the describe errors' and the schedule's seed")
    p.add_argument("--steps", type=int, default=100, help="training steps per trial (a save every --interval)")
    p.add_argument("--interval", type=int, default=20, help="eval, checkpoint and log interval")
    p.add_argument("--faults", default=",".join(POD_FAULT_KINDS), help=f"of {POD_FAULT_KINDS}, comma-separated")
    p.add_argument("--notice-s", type=float, default=30.0, help="spot notice: SIGTERM to the stop")
    p.add_argument("--recreate-s", type=float, default=120.0, help="the preempted slice READY again after")
    p.add_argument("--repair-s", type=float, default=90.0, help="the vanished VM's slice recreated after")
    p.add_argument("--hang-s", type=float, default=45.0, help="one VM silent this long")
    p.add_argument("--describe-error-rate", type=float, default=0.05)
    p.add_argument("--pg-url", help="a PostgreSQL database (empty) instead of a private cluster")
    p.add_argument("--work-dir", type=Path, help="default: a new directory in /tmp, removed after a passing run")
    p.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results", help="pod_soak_<shape>.json here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="trm-pod-soak-", dir="/tmp"))
    settings = PodSoakSettings(
        work=work, shape=args.shape, minutes=args.minutes, seed=args.seed, train_steps=args.steps,
        eval_interval=args.interval, describe_error_rate=args.describe_error_rate, notice_s=args.notice_s,
        recreate_s=args.recreate_s, repair_s=args.repair_s, hang_s=args.hang_s,
        faults=tuple(f for f in args.faults.split(",") if f), tpu=f"soak-{args.shape}-{os.getpid()}",
    )  # fmt: skip
    unknown = set(settings.faults) - set(POD_FAULT_KINDS)
    if unknown:
        raise SystemExit(f"--faults={args.faults}: {sorted(unknown)} unknown; expected some of {POD_FAULT_KINDS}")
    if args.pg_url:
        result = run_soak(settings, args.pg_url)
    else:
        with PrivatePostgres() as pg:
            result = run_soak(settings, pg.url)
    print(result["table"])
    command = " ".join(["python -m tests.chaos --pod", *(sys.argv[1:] if argv is None else argv)])
    header = {**run_header("pod_soak", []), "command": command, "source": source_commit()}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    name = f"pod_soak_{args.shape}"
    (args.out_dir / f"{name}.json").write_text(json.dumps({**header, **result}, indent=1, default=str) + "\n")
    (args.out_dir / f"{name}.md").write_text(result["table"] + "\n")
    if result["ok"] and args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"pod, store, trial directories and driver log: {work}")
    return 0 if result["ok"] else 1


def source_commit() -> str:
    """The commit this checkout is (a `git archive` copy names it in SOURCE_COMMIT)."""
    named = ROOT / "SOURCE_COMMIT"
    if named.exists():
        return named.read_text().strip()
    proc = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"
