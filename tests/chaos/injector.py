"""Runs the drivers of the faulted study and injects the faults: one after the other, each on a retry chain no
earlier fault touched, and only ever on this study's own processes and the suite's own PostgreSQL cluster."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweeps.testing import FAST_TRIAL, sweep_overrides
from tests.chaos.faults import Fault
from tests.chaos.postgres import ROOT, PrivatePostgres
from tests.chaos.processes import Job, alive, logged_step, study_jobs
from tests.chaos.settings import SoakSettings

TICK_S = 0.2


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


class FaultInjector:
    """The drivers of one study and the faults injected into it (`run`)."""

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


@dataclass
class Soaked:
    """A faulted study once its drivers are done: what was injected, how each driver ended, what was left."""

    settings: SoakSettings
    faults: list[Fault]
    url: str
    runs: list[DriverRun]
    t0: float  # when the soak started (time.time())
    wall_s: float
    timed_out: bool  # drivers were still running after settings.timeout_s (and were stopped)
    leftover_jobs: list[dict[str, Any]] = field(default_factory=list)  # training processes alive after the drivers


def run_study(
    settings: SoakSettings,
    faults: list[Fault],
    url: str,
    pg: PrivatePostgres | None = None,
    rng: random.Random | None = None,
    say: Callable[[str], None] = print,
) -> Soaked:
    """Run the study under the faults (a PostgreSQL restart needs `pg`, the cluster behind `url`)."""
    injector = FaultInjector(settings, faults, url, pg=pg, rng=rng, say=say)
    outcome = injector.run()
    return Soaked(
        settings, faults, url, runs=injector.runs, t0=injector.t0, wall_s=outcome["wall_s"],
        timed_out=outcome["timed_out"], leftover_jobs=outcome["leftover_jobs"],
    )  # fmt: skip
