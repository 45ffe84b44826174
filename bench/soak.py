"""Fault-injection soak (issue 14, "a study's record is always true"): a study of short trials on PostgreSQL run
by several drivers at once, while this script SIGKILLs running training jobs, SIGSTOPs jobs past the stall
limit, SIGKILLs a driver and starts it again with the same arguments, and restarts PostgreSQL. At the end it
checks that the study's record is true, and says what each fault did and what recovered it.

    python -m bench.soak                           # 20 trials, 2 drivers, a private PostgreSQL (~10-15 min here)
    python -m bench.soak --trials 40 --job-kills 4 --job-stops 2 --driver-kills 2 --pg-restarts 2 --seed 7
    python -m bench.soak --pg-url postgresql://postgres@127.0.0.1:5433/trm_sweeps   # no PostgreSQL restart then

Faults land at random points (seeded): each is due once the study has launched a random number of jobs, after a
random delay, on a random target (a job that reached a random step, a driver that runs a job). Faults are
injected one after the other; every target is a trial no earlier fault touched (nor its retries).

The PostgreSQL restart needs a cluster of the soak's own (`python -m storage.up` in a temporary directory,
started here unless --pg-url is given): the machine's server is never stopped.

Checks (the study record against the processes and files the trials left):
  faults injected     every planned fault found a target and was injected
  drivers exit 0      every driver this script did not kill finished the study and exited 0
  all settled         every trial COMPLETE / PRUNED / FAIL; none RUNNING or WAITING
  fail reasons        every FAIL has a non-empty `fail_reason`
  true reasons        a faulted trial's record says what happened to it (killed: exit code -9; stopped: no progress
                      for stall_timeout_s; driver killed: its job's stored outcome, or "its driver died")
  no other failures   every FAIL is a refused duplicate, an injected fault, or a retry that ran out of attempts
  recovered           every failed faulted trial's retry chain ends COMPLETE or PRUNED
  budget              the trials that used the budget (not retried, not refused duplicates) number exactly --trials
  retries             a retry has exactly the parameters of the trial it retries
  trained once        no two COMPLETE/PRUNED trials have the same parameters
  duplicates untrained  a refused duplicate (user attr `duplicate_of`) launched no job
  values traceable    every COMPLETE value is its run's: <trial dir>/run/summary.json has outcome COMPLETE, the told value
                      (study.value=best: best_value) and the stored final metrics; the checkpoint of its retry chain
                      (<study dir>/trial-<origin>/checkpoints/latest.pt) has the same step and best value, and an
                      identity whose config values are the trial's parameters
  reports complete    every COMPLETE trial has every eval report from where its job started (0 or its resume step), each
                      the value its run logged in metrics.jsonl
  no job left         no training process of the study is alive once the drivers are done

Writes bench/results/soak.json and soak.md; exits 1 if any check fails (the study's files are kept then).
tests/test_soak.py runs the same machinery with 8 trials and each fault once at fixed points.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench._results import RESULTS, ROOT, run_header, write_results
from storage.record import trial_detail

FAULT_KINDS = ("kill_job", "stop_job", "kill_driver", "restart_pg")
TICK_S = 0.2


# ------------------------------------------------------------------------------------------------ settings


@dataclass
class SoakSettings:
    work: Path  # the study's trial directories, the drivers' logs
    n_trials: int = 20
    drivers: int = 2
    max_concurrent: int = 1  # per driver
    seed: int = 1  # the sweep's sampler seed (each driver derives its own from it) and the fault schedule's
    train_steps: int = 40
    eval_interval: int = 10  # also the log (progress) interval
    stall_timeout_s: int = (
        45  # above a trial's start-up on a loaded 2-core machine (~25 s seen; 20 failed healthy jobs)
    )
    heartbeat_interval_s: int = 1
    grace_s: int = 5
    pruner: str = "hyperband"
    # The study's objective (maximized): eval/accuracy differs between trials of a few steps (exact accuracy is 0
    # for all of them), so a told value that is not its own run's shows, and Hyperband has something to prune.
    objective: str = "eval/accuracy"
    study: str = "soak"
    pg_down_s: float = 10.0
    driver_restart_s: float = 1.0  # a killed driver is started again this long after
    target_wait_s: float = 240.0  # a fault that finds no target for this long is not injected
    timeout_s: float = 1800.0  # the whole soak: drivers still running then are stopped and the checks fail

    @property
    def output_root(self) -> Path:
        return self.work / "runs"


@dataclass
class Fault:
    kind: str  # one of FAULT_KINDS
    after_starts: int  # due once the study has launched this many jobs (retries included) ...
    delay_s: float = 0.0  # ... and this long after that
    min_step: int = (
        0  # job faults: the target job has logged at least this step (0: start-up counts); restart_pg: some job has
    )
    # What happened (filled in when injected).
    injected: bool = False
    at_s: float | None = None  # seconds since the soak started
    trial: int | None = None  # the job's trial (kill_job, stop_job)
    pid: int | None = None  # the process signalled
    step: int | None = None  # the job's last logged step then
    driver: str | None = None  # kill_driver: which driver (and restart_pg: none)
    restarted_pid: int | None = None  # kill_driver: the new driver with the same arguments
    trials: list[int] = field(default_factory=list)  # kill_driver: its trials then; restart_pg: trials running then
    gone_after_s: float | None = None  # stop_job: when the stopped process was gone (the driver stopped it)
    note: str = ""


def scheduled(kind: str, after_starts: int, delay_s: float = 0.0, min_step: int = 0) -> Fault:
    if kind not in FAULT_KINDS:
        raise ValueError(f"fault kind {kind!r}: expected one of {FAULT_KINDS}")
    return Fault(kind, after_starts, delay_s, min_step)


def parse_schedule(text: str) -> list[Fault]:
    """`kind@starts[+delay_s][:min_step],...` (e.g. `stop_job@2:10,restart_pg@2+48`) as faults, in that order."""
    faults = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            kind, rest = item.split("@", 1)
            rest, _, min_step = rest.partition(":")
            starts, _, delay = rest.partition("+")
            faults.append(scheduled(kind, int(starts), float(delay or 0), int(min_step or 0)))
        except ValueError as err:
            raise ValueError(
                f"fault {item!r}: expected kind@starts[+delay_s][:min_step] with kind one of {FAULT_KINDS} ({err})"
            ) from None
    return faults


def random_schedule(rng: random.Random, settings: SoakSettings, counts: dict[str, int]) -> list[Fault]:
    """Each fault due after a random number of launched jobs (1 .. trials-2), a random delay (0-4 s), and for job
    faults a random step the target must have reached (start-up included); in the order they fall due."""
    faults = []
    steps = list(range(0, settings.train_steps, settings.eval_interval))
    for kind in FAULT_KINDS:
        for _ in range(counts.get(kind, 0)):
            min_step = rng.choice(steps) if kind in ("kill_job", "stop_job") else 0
            faults.append(
                scheduled(kind, rng.randint(1, max(1, settings.n_trials - 2)), round(rng.uniform(0, 4), 1), min_step)
            )
    return sorted(faults, key=lambda f: (f.after_starts, f.delay_s))


# ------------------------------------------------------------------------------------- a private cluster


class PrivatePostgres:
    """A PostgreSQL cluster of the soak's own (`python -m storage.up` in a temporary directory), which it may stop
    and start: never the machine's server. A context manager; the cluster is stopped and removed on exit."""

    def __init__(self) -> None:
        from sweeps.launchers.torchrun import free_port

        self.parent = Path(tempfile.mkdtemp(prefix="trm-sweeps-soak-pg-", dir="/tmp"))
        self.parent.chmod(0o755)  # as root the server runs as postgres, which must reach data/
        self.data, self.port = self.parent / "data", free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/trm_sweeps"

    def _up(self, *args: str) -> None:
        cmd = [sys.executable, "-m", "storage.up", "--dir", str(self.data), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[1:])} failed: {proc.stderr.strip() or proc.stdout.strip()}")

    def start(self) -> None:
        self._up("--port", str(self.port))

    def stop(self) -> None:
        self._up("--stop")

    def __enter__(self) -> PrivatePostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.parent, ignore_errors=True)


# ----------------------------------------------------------------------------------------- processes


@dataclass
class Job:
    """A training process of the study, from /proc."""

    pid: int
    ppid: int
    state: str  # R, S, T (stopped), Z ...
    trial: int
    origin: int  # the first trial of its retry chain (whose checkpoints it resumes)
    out_dir: Path


def _arg(argv: list[str], key: str) -> str | None:
    for a in argv:
        if a.startswith(key + "="):
            return a.split("=", 1)[1].strip("'\"")
    return None


def study_jobs(study: str, output_root: Path) -> list[Job]:
    """The live `trm.train` processes of this study (matched on sweep.study and the output root: nothing else on
    the machine is ever signalled)."""
    jobs = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
            if "trm.train" not in argv or _arg(argv, "sweep.study") != study:
                continue
            out_dir = _arg(argv, "out_dir")
            if out_dir is None or not out_dir.startswith(str(output_root)):
                continue
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] in ("Z", "X"):
            continue
        trial = int(_arg(argv, "sweep.trial_number") or -1)
        ckpt = (_arg(argv, "checkpoint.url") or "").rstrip("/")
        origin = Path(ckpt).parent.name if ckpt.endswith("/checkpoints") else ""
        origin_n = (
            int(origin.split("-", 1)[1]) if origin.startswith("trial-") and origin.split("-", 1)[1].isdigit() else trial
        )
        jobs.append(Job(int(entry), int(fields[1]), fields[0], trial, origin_n, Path(out_dir)))
    return sorted(jobs, key=lambda j: j.trial)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rfind(")") + 2] not in ("Z", "X")


def logged_step(out_dir: Path) -> int:
    """The last step a job logged (metrics.jsonl in its out_dir; 0 before its first log point)."""
    try:
        lines = (out_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    steps = []
    for line in lines:
        with contextlib.suppress(ValueError, KeyError, TypeError):  # a line being written
            steps.append(int(json.loads(line)["step"]))
    return max(steps, default=0)


def eval_values(metrics_file: Path, metric: str) -> dict[int, float]:
    """{step: value} of `metric` in a run's metrics.jsonl (what the job logged at each eval)."""
    values = {}
    try:
        lines = metrics_file.read_text().splitlines()
    except OSError:
        return values
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if metric in record:
            values[int(record["step"])] = record[metric]
    return values


def resumed_from(workdir: Path) -> int | None:
    """The step the trial's job started from (its `start` event in worker-0.log); None if it never started."""
    try:
        lines = (workdir / "worker-0.log").read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith('{"event": "start"'):
            try:
                return int(json.loads(line)["resumed_from"])
            except (ValueError, KeyError):
                return None
    return None


@dataclass
class DriverRun:
    """One `python -m sweeps.run` process (a restarted driver is a new run with the same arguments)."""

    name: str  # driver<i>, driver<i>.restart<n>
    index: int
    proc: subprocess.Popen
    log: Path
    started_s: float
    killed: bool = False  # by this script (SIGKILL)
    returncode: int | None = None
    ended_s: float | None = None


# ------------------------------------------------------------------------------------------- the soak


class Soak:
    def __init__(
        self,
        settings: SoakSettings,
        faults: list[Fault],
        url: str,
        pg: PrivatePostgres | None = None,
        rng: random.Random | None = None,
        say: Callable[[str], None] = print,
    ):
        self.s, self.faults, self.url, self.pg = settings, faults, url, pg
        self.rng = rng or random.Random(settings.seed)
        self.say_ = say
        self.runs: list[DriverRun] = []
        self.t0 = time.time()
        self.touched: set[int] = set()  # retry chains (first trial) a fault hit: not targeted again
        self.stopped: dict[int, Fault] = {}  # pid -> the stop_job fault that stopped it

    # ----------------------------------------------------------------------------------------- helpers

    def now(self) -> float:
        return round(time.time() - self.t0, 1)

    def say(self, message: str) -> None:
        self.say_(f"[soak {self.now():6.1f}s] {message}")

    def driver_argv(self, index: int) -> list[str]:
        from sweeps.testing import FAST_TRIAL, sweep_overrides

        s = self.s
        trial = [
            o for o in FAST_TRIAL if not o.startswith(("train.steps", "train.log_interval", "train.eval_interval"))
        ]
        trial += [
            f"train.steps={s.train_steps}",
            f"train.log_interval={s.eval_interval}",
            f"train.eval_interval={s.eval_interval}",
            "wandb.enabled=false",
        ]
        extra = [
            "study=halting", f"study.name={s.study}", f"study.objective={s.objective}", f"n_trials={s.n_trials}", f"max_concurrent={s.max_concurrent}",
            f"pruner={s.pruner}", f"seed={s.seed}", f"stall_timeout_s={s.stall_timeout_s}", "wandb.enabled=false",
            "wandb.summary=false", f"hydra.run.dir={s.work / 'hydra' / f'driver{index}'}",
        ]  # fmt: skip
        if s.pruner in ("hyperband", "successive_halving"):
            extra.append(f"pruner.min_resource={s.eval_interval}")
        argv = sweep_overrides(self.url, s.output_root, *extra, trial=trial)
        replaced = {"heartbeat.grace_s": str(s.grace_s), "heartbeat.interval_s": str(s.heartbeat_interval_s)}
        return [
            f"{a.split('=', 1)[0]}={replaced[a.split('=', 1)[0]]}" if a.split("=", 1)[0] in replaced else a
            for a in argv
        ]

    def start_driver(self, index: int, name: str) -> DriverRun:
        log = self.s.work / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
        with open(log, "w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "sweeps.run", *self.driver_argv(index)],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        run = DriverRun(name, index, proc, log, self.now())
        self.runs.append(run)
        return run

    def live_drivers(self) -> list[DriverRun]:
        return [r for r in self.runs if r.returncode is None]

    def launched(self) -> int:
        """Jobs the study has launched so far (retries included): trial directories with a worker log."""
        return len(list(self.s.output_root.glob(f"{self.s.study}/*/trial-*/worker-0.log")))

    def jobs(self) -> list[Job]:
        return study_jobs(self.s.study, self.s.output_root)

    def tick(self) -> None:
        """Reap drivers that ended; note when a stopped job went away."""
        for run in self.live_drivers():
            code = run.proc.poll()
            if code is not None:
                run.returncode, run.ended_s = code, self.now()
                if not run.killed:
                    self.say(f"{run.name} (pid {run.proc.pid}) exited with {code}")
        for pid, fault in list(self.stopped.items()):
            if not alive(pid):
                fault.gone_after_s = round(self.now() - (fault.at_s or 0.0), 1)
                self.say(
                    f"stopped job of trial {fault.trial} (pid {pid}) is gone, {fault.gone_after_s} s after SIGSTOP"
                )
                del self.stopped[pid]

    def wait(self, seconds: float) -> None:
        end = time.time() + seconds
        while time.time() < end:
            self.tick()
            time.sleep(min(TICK_S, max(0.0, end - time.time())))

    def job_candidates(self, min_step: int) -> list[Job]:
        """Jobs a job fault may hit: run by a live driver, not stopped, on an untouched chain, mid-training (past
        min_step, short of its last step)."""
        drivers = {r.proc.pid for r in self.live_drivers()}
        return [
            j
            for j in self.jobs()
            if j.ppid in drivers
            and j.state != "T"
            and j.pid not in self.stopped
            and j.origin not in self.touched
            and min_step <= logged_step(j.out_dir) < self.s.train_steps
        ]

    # --------------------------------------------------------------------------------------- injecting

    def inject(self, fault: Fault) -> None:
        deadline = time.time() + self.s.target_wait_s
        while time.time() < deadline and self.live_drivers():
            if self._try(fault):
                fault.injected, fault.at_s = True, fault.at_s if fault.at_s is not None else self.now()
                return
            self.wait(TICK_S)
        fault.note = fault.note or "no target found (the study ended, or nothing was running)"
        self.say(f"{fault.kind}: not injected: {fault.note}")

    def _try(self, fault: Fault) -> bool:
        if fault.kind in ("kill_job", "stop_job"):
            candidates = self.job_candidates(fault.min_step)
            if not candidates:
                return False
            job = self.rng.choice(candidates)
            step = logged_step(job.out_dir)
            try:
                os.kill(job.pid, signal.SIGKILL if fault.kind == "kill_job" else signal.SIGSTOP)
            except ProcessLookupError:
                return False  # it ended meanwhile: pick again
            fault.trial, fault.pid, fault.step, fault.at_s = job.trial, job.pid, step, self.now()
            self.touched.add(job.origin)
            if fault.kind == "stop_job":
                self.stopped[job.pid] = fault
            self.say(
                f"{'SIGKILL' if fault.kind == 'kill_job' else 'SIGSTOP'} job of trial {job.trial} (pid {job.pid}, step {fault.step})"
            )
            return True
        if fault.kind == "kill_driver":
            jobs = self.jobs()
            stopped_owners = {j.ppid for j in jobs if j.pid in self.stopped}
            owners = {r.proc.pid: r for r in self.live_drivers()}
            # A driver with a job of an untouched chain, and none of our stopped jobs (its stall handling is
            # another fault's recovery: a dead driver cannot stop a stopped job).
            candidates = sorted(
                {
                    j.ppid
                    for j in jobs
                    if j.ppid in owners and j.ppid not in stopped_owners and j.origin not in self.touched
                }
            )
            if not candidates:
                return False
            run = owners[self.rng.choice(candidates)]
            fault.trials = [j.trial for j in jobs if j.ppid == run.proc.pid]
            fault.driver, fault.pid, fault.at_s = run.name, run.proc.pid, self.now()
            run.killed = True
            os.kill(run.proc.pid, signal.SIGKILL)
            run.proc.wait()
            run.returncode, run.ended_s = run.proc.returncode, self.now()
            self.touched.update(j.origin for j in jobs if j.ppid == run.proc.pid)
            self.say(f"SIGKILL {run.name} (pid {run.proc.pid}) with the job(s) of trial(s) {fault.trials} running")
            self.wait(self.s.driver_restart_s)
            restarts = sum(1 for r in self.runs if r.index == run.index)
            new = self.start_driver(run.index, f"driver{run.index}.restart{restarts}")
            fault.restarted_pid = new.proc.pid
            self.say(f"started {new.name} (pid {new.proc.pid}) with the same arguments")
            return True
        if fault.kind == "restart_pg":
            if self.pg is None:
                fault.note = "no private cluster (--pg-url): the machine's server is never restarted"
                return False
            jobs = [j for j in self.jobs() if j.pid not in self.stopped and logged_step(j.out_dir) >= fault.min_step]
            if not jobs:
                return False
            fault.trials, fault.at_s = [j.trial for j in jobs], self.now()
            self.pg.stop()
            self.say(f"PostgreSQL stopped with the job(s) of trial(s) {fault.trials} running")
            self.wait(self.s.pg_down_s)
            self.pg.start()
            fault.note = f"down {round(self.now() - fault.at_s, 1)} s"
            self.say(f"PostgreSQL started again ({fault.note})")
            return True
        raise ValueError(fault.kind)

    # --------------------------------------------------------------------------------------------- run

    def run(self) -> dict[str, Any]:
        self.s.work.mkdir(parents=True, exist_ok=True)
        self.say(
            f"study {self.s.study!r}: {self.s.n_trials} trials, {self.s.drivers} drivers x {self.s.max_concurrent}, "
            f"storage {self.url}; faults: " + ", ".join(f"{f.kind}@{f.after_starts}+{f.delay_s}s" for f in self.faults)
        )
        for i in range(self.s.drivers):
            run = self.start_driver(i, f"driver{i}")
            self.say(f"started {run.name} (pid {run.proc.pid})")
        deadline = self.t0 + self.s.timeout_s
        timed_out = False
        try:
            for fault in self.faults:
                while self.launched() < fault.after_starts and self.live_drivers() and time.time() < deadline:
                    self.wait(TICK_S)
                self.wait(fault.delay_s)
                if time.time() < deadline and self.live_drivers():
                    self.inject(fault)
                else:
                    fault.note = "the study ended before this fault was due"
            while self.live_drivers() and time.time() < deadline:
                self.wait(0.5)
            timed_out = bool(self.live_drivers())
        finally:
            if self.live_drivers():
                self.say(
                    f"stopping {len(self.live_drivers())} driver(s) still running (timeout {self.s.timeout_s:g} s)"
                )
                for run in self.live_drivers():
                    run.proc.send_signal(signal.SIGTERM)
                for run in self.live_drivers():
                    try:
                        run.proc.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        run.proc.kill()
                        run.proc.wait()
                self.tick()
            leftovers = self.reap_jobs()
        wall = self.now()
        self.say(f"drivers done after {wall} s; checking the record")
        return {"wall_s": wall, "timed_out": timed_out, "leftover_jobs": leftovers}

    def reap_jobs(self) -> list[dict[str, Any]]:
        """Jobs of the study still alive once the drivers are done: an orphan of the killed driver stops at its next
        eval, so wait a little; what is still there then is reported and killed (only our own processes)."""
        end = time.time() + 3 * self.s.eval_interval + self.s.grace_s + 30
        while time.time() < end and self.jobs():
            self.wait(0.5)
        left = []
        for job in self.jobs():
            left.append({"trial": job.trial, "pid": job.pid, "state": job.state, "step": logged_step(job.out_dir)})
            self.say(f"job of trial {job.trial} (pid {job.pid}, state {job.state}) still alive: killing it")
            with contextlib.suppress(ProcessLookupError):
                os.kill(job.pid, signal.SIGKILL)
        self.tick()
        return left


# ------------------------------------------------------------------------------------------ the checks


def load_trials(url: str, study: str) -> tuple[list[Any], dict[str, Any]]:
    import optuna

    from storage import open_storage

    loaded = optuna.load_study(study_name=study, storage=open_storage(url))
    return loaded.get_trials(deepcopy=False), loaded.user_attrs


def retry_history(trial: Any) -> list[int]:
    """Optuna's retry chain of a trial (the attempts before it, first first), without its experimental warning."""
    import optuna
    from optuna.storages import RetryHeartbeatStaleTrialCallback

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return RetryHeartbeatStaleTrialCallback.retry_history(trial)


def chains(trials: list[Any]) -> dict[int, list[int]]:
    """Each trial number -> the numbers of its whole retry chain, first attempt first."""
    origin = {}
    for t in trials:
        history = retry_history(t)
        origin[t.number] = history[0] if history else t.number
    members: dict[int, list[int]] = {}
    for number in sorted(origin):
        members.setdefault(origin[number], []).append(number)
    return {n: members[origin[n]] for n in origin}


def check_record(
    url: str, settings: SoakSettings, faults: list[Fault], runs: list[DriverRun], outcome: dict[str, Any], t0: float
) -> dict[str, Any]:
    """Every check of the module docstring; returns {checks: [...], recoveries: [...], trials: [...]}."""
    import torch
    from optuna.trial import TrialState

    from storage.record import DUPLICATE_OF_ATTR
    from sweeps.space import params_to_values

    trials, study_attrs = load_trials(url, settings.study)
    by_number = {t.number: t for t in trials}
    chain = chains(trials)
    retried = {n for t in trials for n in retry_history(t)}
    duplicates = [t for t in trials if DUPLICATE_OF_ATTR in t.user_attrs]
    ran = [t for t in trials if DUPLICATE_OF_ATTR not in t.user_attrs]
    finished = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    checks: list[dict[str, Any]] = []

    def check(name: str, problems: list[str], ok_detail: str) -> None:
        checks.append(
            {
                "check": name,
                "ok": not problems,
                "detail": "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
                if problems
                else ok_detail,
            }
        )

    def reason(t: Any) -> str:
        return str(t.user_attrs.get("fail_reason") or "")

    def first_line(text: str) -> str:
        return next(iter(text.splitlines()), "")[:160]

    # Faults injected; drivers.
    check(
        "faults injected",
        [f"{f.kind}@{f.after_starts}: {f.note}" for f in faults if not f.injected],
        f"{sum(f.injected for f in faults)} of {len(faults)}",
    )
    bad_drivers = [f"{r.name} exited {r.returncode}" for r in runs if not r.killed and r.returncode != 0]
    if outcome.get("timed_out"):
        bad_drivers.insert(0, f"drivers still running after {settings.timeout_s:g} s (stopped)")
    check(
        "drivers exit 0",
        bad_drivers,
        ", ".join(f"{r.name}: {'SIGKILL (injected)' if r.killed else r.returncode}" for r in runs),
    )

    # States and reasons.
    check(
        "all settled",
        [f"trial {t.number} {t.state.name}" for t in trials if t.state not in finished],
        f"{len(trials)} trials: " + ", ".join(f"{s.name} {sum(t.state == s for t in trials)}" for s in finished),
    )
    check(
        "fail reasons",
        [
            f"trial {t.number} FAIL without a reason"
            for t in trials
            if t.state == TrialState.FAIL and not reason(t).strip()
        ],
        f"{sum(t.state == TrialState.FAIL for t in trials)} FAIL, each with a reason",
    )

    # What each fault did to its trial(s), and the retry chain that recovered it.
    expected: dict[int, tuple[str, Fault]] = {}
    for f in faults:
        if not f.injected:
            continue
        if f.kind in ("kill_job", "stop_job") and f.trial is not None:
            expected[f.trial] = (f.kind, f)
        elif f.kind == "kill_driver":
            for n in f.trials:
                expected.setdefault(n, ("kill_driver", f))
    untrue, unrecovered = [], []
    for n, (kind, _f) in sorted(expected.items()):
        t = by_number.get(n)
        if t is None:
            untrue.append(f"trial {n} ({kind}) is not in the study")
            continue
        text = reason(t)
        if kind == "kill_job":
            ok = t.state == TrialState.FAIL and "exited with code -9" in text
        elif kind == "stop_job":
            ok = (
                t.state == TrialState.FAIL
                and "no progress for" in text
                and f"stall_timeout_s={settings.stall_timeout_s:g}" in text
            )
        else:  # its driver was killed: the outcome its job stored, or failed as orphaned
            stored = t.user_attrs.get("outcome")
            ok = (t.state == TrialState.FAIL and "driver died" in text) or (
                t.state.name == stored and t.state in (TrialState.COMPLETE, TrialState.PRUNED)
            )
        if not ok:
            untrue.append(f"trial {n} ({kind}): {t.state.name} {first_line(text)!r}")
        last = by_number[chain[n][-1]]
        if t.state == TrialState.FAIL and last.state not in (TrialState.COMPLETE, TrialState.PRUNED):
            unrecovered.append(
                f"trial {n} ({kind}): chain {chain[n]} ends {last.state.name} {first_line(reason(last))!r}"
            )
    check("true reasons", untrue, f"{len(expected)} faulted trials, each says what happened to it")
    check("recovered", unrecovered, "every failed faulted trial's retry chain ends COMPLETE or PRUNED")

    # Failures nobody injected (a retry that fails again counts too).
    explained = set(expected) | {d.number for d in duplicates}
    other = [t for t in ran if t.state == TrialState.FAIL and t.number not in explained]
    check(
        "no other failures",
        [f"trial {t.number}: {first_line(reason(t))!r}" for t in other],
        "every FAIL is an injected fault or a refused duplicate",
    )

    # Budget, retries, configurations trained once, duplicates.
    used = [t for t in ran if t.state in finished and t.number not in retried]
    check(
        "budget",
        [] if len(used) == settings.n_trials else [f"{len(used)} trials used the budget, not {settings.n_trials}"],
        f"{len(used)} trials used the budget ({len(ran) - len(used)} attempts retried, {len(duplicates)} refused duplicates)",
    )
    check(
        "retries",
        [
            f"retry {t.number} of {chain[t.number][0]} has other parameters"
            for t in trials
            if chain[t.number][0] != t.number and t.params != by_number[chain[t.number][0]].params
        ],
        f"{sum(1 for t in trials if chain[t.number][0] != t.number)} retries, each with its first attempt's parameters",
    )
    seen: dict[str, int] = {}
    twice = []
    for t in ran:
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
            key = json.dumps(t.params, sort_keys=True, default=str)
            if key in seen:
                twice.append(f"trials {seen[key]} and {t.number}: {params_to_values(t.params)}")
            seen.setdefault(key, t.number)
    check("trained once", twice, f"{len(seen)} COMPLETE/PRUNED trials, all with different parameters")
    untrained = []
    for d in duplicates:
        workdir = Path(str(d.user_attrs.get("workdir") or ""))
        twin = by_number.get(d.user_attrs[DUPLICATE_OF_ATTR])
        if (
            d.state != TrialState.FAIL
            or (workdir.name and (workdir / "worker-0.log").exists())
            or twin is None
            or twin.params != d.params
        ):
            untrained.append(
                f"trial {d.number} (duplicate of {d.user_attrs[DUPLICATE_OF_ATTR]}): {d.state.name}, workdir {workdir}"
            )
    check("duplicates untrained", untrained, f"{len(duplicates)} refused duplicate(s), none launched")

    # Every COMPLETE value is its run's: summary.json and the chain's checkpoint.
    untraceable, gaps = [], []
    value_mode, objective = "best", study_attrs.get("objective", settings.objective)
    metric = study_attrs.get("prune_metric") or objective  # what the jobs reported at each eval
    for t in ran:
        workdir = Path(str(t.user_attrs.get("workdir")))
        if t.state == TrialState.PRUNED:  # its job said so (or, orphaned, stored it)
            try:
                pruned = json.loads((workdir / "run" / "summary.json").read_text()).get("outcome")
            except (OSError, ValueError) as err:
                pruned = f"no summary.json ({type(err).__name__})"
            if pruned != "PRUNED":
                untraceable.append(f"trial {t.number}: PRUNED, its run's summary says {pruned}")
            continue
        if t.state != TrialState.COMPLETE:
            continue
        problems = []
        try:
            summary = json.loads((workdir / "run" / "summary.json").read_text())
        except (OSError, ValueError) as err:
            untraceable.append(f"trial {t.number}: no summary.json ({err})")
            continue
        told = summary.get("best_value") if value_mode == "best" else (summary.get("final") or {}).get(objective)
        if summary.get("outcome") != "COMPLETE":
            problems.append(f"summary outcome {summary.get('outcome')}")
        if told is None or float(told) != t.value:
            problems.append(f"told {t.value}, summary best_value {told}")
        if (summary.get("final") or {}) != (trial_detail(t.user_attrs, "final_metrics") or {}):
            problems.append("final metrics differ from the summary's")
        ckpt_path = workdir.parent / f"trial-{chain[t.number][0]}" / "checkpoints" / "latest.pt"
        try:
            state = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        except Exception as err:  # noqa: BLE001 - any unreadable checkpoint is a finding
            untraceable.append(f"trial {t.number}: checkpoint {ckpt_path} unreadable ({type(err).__name__}: {err})")
            continue
        config = (state.get("identity") or {}).get("config") or {}
        for key, value in params_to_values(t.params).items():
            if config.get(key, "<absent>") != value:
                problems.append(f"checkpoint {key}={config.get(key, '<absent>')!r}, trial {value!r}")
        if state.get("step") != summary.get("steps") or state.get("step") != settings.train_steps:
            problems.append(
                f"checkpoint at step {state.get('step')}, summary {summary.get('steps')}, train.steps {settings.train_steps}"
            )
        if (state.get("best") or {}).get("value") != summary.get("best_value"):
            problems.append(
                f"checkpoint best {(state.get('best') or {}).get('value')}, summary {summary.get('best_value')}"
            )
        if problems:
            untraceable.append(f"trial {t.number}: " + ", ".join(problems))
        start = resumed_from(workdir)
        want = list(range((start or 0) + settings.eval_interval, settings.train_steps + 1, settings.eval_interval))
        logged = eval_values(workdir / "run" / "metrics.jsonl", metric)
        if start is None or sorted(t.intermediate_values) != want:
            gaps.append(
                f"trial {t.number}: reports at {sorted(t.intermediate_values)}, job started at step {start}, expected {want}"
            )
        elif any(logged.get(step) != value for step, value in t.intermediate_values.items()):
            gaps.append(
                f"trial {t.number}: reported {dict(sorted(t.intermediate_values.items()))}, its run logged {logged}"
            )
    n_complete = sum(t.state == TrialState.COMPLETE for t in ran)
    check(
        "values traceable",
        untraceable,
        f"{n_complete} COMPLETE values = their summary.json and their chain's checkpoint (identity = params)",
    )
    check(
        "reports complete",
        gaps,
        f"{n_complete} COMPLETE trials: every eval from their start step reported, each the value their run logged",
    )
    check(
        "no job left",
        [
            f"trial {j['trial']} pid {j['pid']} state {j['state']} at step {j['step']}"
            for j in outcome.get("leftover_jobs", [])
        ],
        "no training process of the study alive after the drivers",
    )

    return {
        "checks": checks,
        "recoveries": recoveries(faults, by_number, chain, t0),
        "trials": [trial_row(t, chain) for t in trials],
    }


def trial_row(t: Any, chain: dict[int, list[int]]) -> dict[str, Any]:
    from sweeps.space import params_to_values

    return {
        "number": t.number,
        "state": t.state.name,
        "value": t.value if t.state.name == "COMPLETE" else None,
        "params": params_to_values(t.params),
        "chain": chain[t.number],
        "duplicate_of": t.user_attrs.get("duplicate_of"),
        "fail_reason": next(iter(str(t.user_attrs.get("fail_reason") or "").splitlines()), "") or None,
        "started": t.datetime_start.timestamp() if t.datetime_start else None,
        "completed": t.datetime_complete.timestamp() if t.datetime_complete else None,
    }


def fate(n: int, by_number: dict[int, Any], chain: dict[int, list[int]], since: float | None) -> str:
    """What became of trial n: its state and reason, then its retry (the chain's last attempt) and where it resumed."""
    t = by_number.get(n)
    if t is None:
        return f"trial {n}: not in the study"
    words = f"trial {n} {t.state.name}"
    if t.state.name == "FAIL":
        words += f" ({next(iter(str(t.user_attrs.get('fail_reason') or '').splitlines()), '')[:90]})"
    later = [m for m in chain.get(n, []) if m > n]
    if later:
        last = by_number[later[-1]]
        start = resumed_from(Path(str(last.user_attrs.get("workdir"))))
        words += f" -> retry trial {last.number} {last.state.name}"
        if len(later) > 1:
            words += f" (after {len(later) - 1} more attempt(s))"
        if start is not None:
            words += f", resumed from step {start}"
        if since is not None and last.datetime_complete is not None:
            words += f", {last.datetime_complete.timestamp() - since:.0f} s after the fault"
    return words


def recoveries(
    faults: list[Fault], by_number: dict[int, Any], chain: dict[int, list[int]], t0: float
) -> list[dict[str, Any]]:
    rows = []
    for i, f in enumerate(faults):
        if not f.injected:
            rows.append(
                {
                    "fault": i + 1,
                    "kind": f.kind,
                    "at_s": None,
                    "what": f"{f.kind}: not injected ({f.note})",
                    "recovery": "-",
                }
            )
            continue
        since = t0 + (f.at_s or 0.0)
        if f.kind in ("kill_job", "stop_job"):
            verb = "SIGKILL" if f.kind == "kill_job" else "SIGSTOP"
            what = f"{verb} job of trial {f.trial} at step {f.step} (pid {f.pid})"
            recovery = fate(f.trial, by_number, chain, since)
            if f.kind == "stop_job":
                recovery += "; stopped process " + (
                    f"gone {f.gone_after_s} s after SIGSTOP"
                    if f.gone_after_s is not None
                    else "NOT stopped by the driver"
                )
        elif f.kind == "kill_driver":
            what = f"SIGKILL {f.driver} (pid {f.pid}) running trial(s) {f.trials}; restarted as pid {f.restarted_pid}"
            told = [n for n in f.trials if n in by_number and by_number[n].state.name in ("COMPLETE", "PRUNED")]
            recovery = (
                "; ".join(
                    fate(n, by_number, chain, since) + (" (the outcome its orphaned job stored)" if n in told else "")
                    for n in f.trials
                )
                or "no trial of its own running"
            )
        else:
            what = f"PostgreSQL restart ({f.note}) with trial(s) {f.trials} running"
            recovery = "; ".join(fate(n, by_number, chain, since) for n in f.trials)
        rows.append({"fault": i + 1, "kind": f.kind, "at_s": f.at_s, "what": what, "recovery": recovery})
    return rows


# ------------------------------------------------------------------------------------------- reporting


def markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    counts = result["fault_counts"]
    lines = [
        f"Soak: {s['n_trials']} trials, {s['drivers']} drivers x {s['max_concurrent']}, study=halting objective={s['objective']} pruner={s['pruner']}, "
        f"{s['train_steps']}-step trials, stall_timeout_s={s['stall_timeout_s']}, heartbeat {s['heartbeat_interval_s']} s / "
        f"grace {s['grace_s']} s, seed {s['seed']}; {result['wall_s']:.0f} s wall; faults injected: "
        + ", ".join(f"{k} {v}" for k, v in counts.items()),
        "",
        "| # | at (s) | fault | what the record says, and the recovery |",
        "| --- | --- | --- | --- |",
    ]
    for r in result["recoveries"]:
        at = "-" if r.get("at_s") is None else f"{r['at_s']:.0f}"
        lines.append(f"| {r['fault']} | {at} | {r['what']} | {r['recovery']} |")
    lines += ["", "| check | ok | detail |", "| --- | --- | --- |"]
    for c in result["checks"]:
        lines.append(f"| {c['check']} | {'yes' if c['ok'] else '**NO**'} | {c['detail']} |")
    lines += ["", f"**{'PASS' if result['ok'] else 'FAIL'}**"]
    return "\n".join(lines)


def run_soak(
    settings: SoakSettings,
    faults: list[Fault],
    url: str | None = None,
    pg: PrivatePostgres | None = None,
    rng: random.Random | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the study under the faults and check its record; `url` defaults to the private cluster's."""
    url = url or (pg.url if pg is not None else None)
    if url is None:
        raise ValueError("run_soak needs a storage url or a PrivatePostgres")
    soak = Soak(settings, faults, url, pg=pg, rng=rng, say=say)
    outcome = soak.run()
    record = check_record(url, settings, faults, soak.runs, outcome, soak.t0)
    counts = {kind: sum(1 for f in faults if f.kind == kind and f.injected) for kind in FAULT_KINDS}
    result = {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(settings).items()},
        "storage": url,
        "wall_s": outcome["wall_s"],
        "fault_counts": counts,
        "faults": [asdict(f) for f in faults],
        "drivers": [
            {
                "name": r.name,
                "pid": r.proc.pid,
                "killed": r.killed,
                "returncode": r.returncode,
                "started_s": r.started_s,
                "ended_s": r.ended_s,
                "log": str(r.log),
            }
            for r in soak.runs
        ],
        "leftover_jobs": outcome["leftover_jobs"],
        **record,
    }
    result["ok"] = all(c["ok"] for c in result["checks"])
    result["table"] = markdown(result)
    return result


def log_tails(result: dict[str, Any], lines: int = 25) -> str:
    """The end of every driver's log (heartbeat and progress chatter left out): what a failed check needs first."""
    noise = ("heartbeat for trial", "no eval yet", ": step ")
    out = []
    for d in result["drivers"]:
        try:
            kept = [
                line
                for line in Path(d["log"]).read_text(errors="replace").splitlines()
                if line.strip() and not any(n in line for n in noise)
            ]
        except OSError as err:
            kept = [f"(unreadable: {err})"]
        out.append(f"--- {d['name']} ({d['log']})\n" + "\n".join(kept[-lines:]))
    return "\n".join(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    p.add_argument("--out-dir", type=Path, default=RESULTS, help="soak.json and soak.md go here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
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
    if args.pg_url and any(f.kind == "restart_pg" for f in faults):
        faults = [f for f in faults if f.kind != "restart_pg"]
    if args.pg_url:
        result = run_soak(settings, faults, url=args.pg_url, rng=rng)
    else:
        with PrivatePostgres() as pg:
            result = run_soak(settings, faults, pg=pg, rng=rng)
    result = {**run_header("soak", argv), **result, "work_dir": str(work)}
    write_results("soak", result, result["table"], args.out_dir)
    if result["ok"] and not args.keep and args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"study files and driver logs: {work}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
