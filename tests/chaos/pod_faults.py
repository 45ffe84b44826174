"""The pod soak's faults (issue 56, Done when): what the stand-in gcloud (tests/fake_gcloud) does to the slice and
when, drawn from a seed, and the hand that does it while the study runs. Describe errors are the stand-in's own
($FAKE_TPU_DESCRIBE_ERROR_RATE, seeded per call); the rest are `gcloud --fake-admin` actions at set times:
- preempt: a spot preemption, its notice's SIGTERM `notice_s` before the stop, the slice recreated `recreate_s`
  after it (fresh VMs: nothing of the study's left on them);
- vanish: one VM gone under a slice that still reads READY (its processes killed, ssh to it silent: a connection
  waits for the TCP timeout, an open session for ssh's keep-alive), the slice recreated `repair_s` later (Google's
  repair; until then the study waits);
- hang_ssh: one VM's network silent for `hang_s` and then back (its processes keep running): the sessions open to
  it end by ssh's keep-alive, new ones wait for the TCP timeout."""

from __future__ import annotations

import random
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

FAKE_GCLOUD = Path(__file__).resolve().parents[1] / "fake_gcloud" / "gcloud"
POD_FAULT_KINDS = ("preempt", "vanish", "hang_ssh")
TRAINING_WAIT_S = 300.0  # preempt, vanish: how long a fault waits for a job in training before it goes anyway


@dataclass(frozen=True)
class PodSoakSettings:
    work: Path  # the pod's VMs, the bucket store, the trials' directories, the driver's log
    shape: str = "v4-32"  # the stand-in slice's accelerator type ($FAKE_TPU_TYPE)
    minutes: float = 30.0  # the study's length: no trial starts after it (sweep `timeout`), running ones finish
    n_trials: int = 10000  # the study's configurations (sweep `n_trials`): the soak's end by --minutes, not by it
    seed: int = 1  # the sweep's sampler seed, the describe errors' and the fault schedule's
    train_steps: int = 100
    eval_interval: int = 20  # also the checkpoint interval (a save at each eval) and the log interval
    describe_error_rate: float = 0.05  # a 503 or 429 on this share of `tpu-vm describe` calls
    notice_s: float = 30.0  # the spot notice: SIGTERM to the stop (Compute Engine's 30 s)
    recreate_s: float = 120.0  # the preempted slice is READY again this long after the stop
    repair_s: float = 90.0  # a vanished VM's slice is recreated this long after the vanish
    hang_s: float = 45.0  # one VM silent this long (longer than the keep-alive below gives up)
    tcp_timeout_s: float = 20.0  # a connection to a silent VM fails after this (Linux's ~130 s, shortened)
    ssh_alive_interval_s: int = 5  # launcher.ssh_alive_interval_s (x ssh_alive_count 3: 15 s to give up)
    faults: tuple[str, ...] = POD_FAULT_KINDS  # which --fake-admin faults run (describe errors always)
    tpu: str = "soak-pod"  # the slice's name (the soak makes it unique: the stop's pkill spans the machine)

    @property
    def pod_root(self) -> Path:
        return self.work / "pod"

    @property
    def gcs_root(self) -> Path:
        return self.work / "gcs"

    @property
    def output_root(self) -> Path:
        return self.work / "out"


@dataclass
class PodFault:
    kind: str  # one of POD_FAULT_KINDS
    at_s: float  # due this long after the driver started
    worker: int = 0  # vanish, hang_ssh: which VM
    into_training_s: float = 0.0  # ... and once a job has trained this long (its start event): any kind may wait
    trial: str = ""  # the trial whose job was training then ("" if none was within TRAINING_WAIT_S)
    injected_at_s: float | None = None
    healed_at_s: float | None = None  # the slice recreated (preempt, vanish) or the VM audible again (hang_ssh)
    note: str = ""


def pod_schedule(rng: random.Random, settings: PodSoakSettings, workers: int) -> list[PodFault]:
    """Each fault at a random time in its own share of the study (preempt in the first third's second half,
    vanish around the middle, hang_ssh in the last third's first half), so that one recovery ends before the next
    fault; vanish and hang_ssh on a random VM (not 0 for vanish when there is another: worker 0 also runs the job's
    rank 0, which a preemption already covers). Preempt and vanish wait, besides, for a job 1-10 s into its
    training: at a random time most of a tiny trial here is its start-up, and a fault there tests no save."""
    length = settings.minutes * 60
    windows = {"preempt": (0.15, 0.3), "vanish": (0.45, 0.55), "hang_ssh": (0.68, 0.78)}
    faults = []
    for kind in settings.faults:
        low, high = windows[kind]
        worker = rng.randrange(1, workers) if kind == "vanish" and workers > 1 else rng.randrange(workers)
        into = round(rng.uniform(1.0, 10.0), 1) if kind in ("preempt", "vanish") else 0.0
        faults.append(PodFault(kind, round(rng.uniform(low, high) * length, 1), worker, into))
    return sorted(faults, key=lambda f: f.at_s)


def admin(action: str, tpu: str, env: dict[str, str]) -> None:
    subprocess.run([str(FAKE_GCLOUD), "--fake-admin", action, tpu], env=env, check=True, timeout=3600)


class PodHand:
    """Injects the schedule's faults from a thread (`run`), each at its time after `t0`; `stop` ends the wait."""

    def __init__(self, settings: PodSoakSettings, faults: list[PodFault], env: dict[str, str], t0: float) -> None:
        self.settings, self.faults, self.env, self.t0 = settings, faults, env, t0
        self.stopped = False

    def now(self) -> float:
        return time.monotonic() - self.t0

    def sleep_until(self, at_s: float) -> bool:
        while self.now() < at_s:
            if self.stopped:
                return False
            time.sleep(min(1.0, at_s - self.now()))
        return not self.stopped

    def run(self) -> None:
        for fault in self.faults:
            if not self.sleep_until(fault.at_s):
                fault.note = "not injected: the study had ended"
                continue
            if fault.into_training_s:
                hit = {f.trial for f in self.faults if f.trial}
                fault.trial = self.wait_for_training(fault.into_training_s, hit)
            at_s = round(self.now(), 1)
            print(
                f"[pod soak {at_s:.0f}s] {fault.kind} (worker {fault.worker}, {fault.trial or 'no job'} training)",
                flush=True,
            )
            try:
                self.inject(fault)
            except (OSError, subprocess.SubprocessError) as err:  # said in the record: the check fails on it
                fault.note = f"not injected: {type(err).__name__}: {err}"
                continue
            fault.injected_at_s = at_s
            fault.healed_at_s = round(self.now(), 1)
            print(f"[pod soak {fault.healed_at_s:.0f}s] {fault.kind} healed", flush=True)

    def wait_for_training(self, into_s: float, hit: set[str]) -> str:
        """Wait until the latest trial's job has been training `into_s` seconds (its worker-0.log has the start
        event and no end yet), at most TRAINING_WAIT_S; that trial's directory name, or "" if none was. Only the
        latest, and not one of `hit` (the trials earlier faults met): an attempt killed in training has a start and
        no end in its log for ever (slots=pod: one trial runs at a time), so a fault that follows a preemption
        waits for the next attempt's training instead of landing at once on the dead one's."""
        seen: dict[Path, float] = {}  # a trial's log -> when its start event was first seen
        deadline = self.now() + TRAINING_WAIT_S
        while self.now() < deadline and not self.stopped:
            logs = self.settings.output_root.glob("*/*/trial-*/worker-0.log")
            latest = sorted(logs, key=lambda p: int(p.parent.name.partition("-")[2]))[-1:]
            for log in (p for p in latest if p.parent.name not in hit):
                text = log.read_text(errors="replace")
                if '{"event": "start"' in text and '{"event": "end"' not in text:
                    seen.setdefault(log, self.now())
                    if self.now() - seen[log] >= into_s:
                        return log.parent.name
            time.sleep(0.25)
        return ""

    def inject(self, fault: PodFault) -> None:
        s, pod = self.settings, self.settings.pod_root
        if fault.kind == "preempt":  # returns after the notice, the stop and the recreate
            admin("preempt", s.tpu, {**self.env, "FAKE_TPU_PREEMPT_NOTICE_S": str(s.notice_s),
                                     "FAKE_TPU_RECREATE_AFTER_S": str(s.recreate_s)})  # fmt: skip
        elif fault.kind == "vanish":  # silent first, then its processes killed: no RST reaches a client
            admin(f"hang={fault.worker}", s.tpu, self.env)
            admin(f"vanish={fault.worker}", s.tpu, self.env)
            self.sleep_until(self.now() + s.repair_s)
            admin("recreate", s.tpu, self.env)  # fresh VMs; the silent one's marker goes with it
        elif fault.kind == "hang_ssh":
            admin(f"hang={fault.worker}", s.tpu, self.env)
            self.sleep_until(self.now() + s.hang_s)
            (pod / s.tpu / f"worker-{fault.worker}.hung").unlink(missing_ok=True)  # the network is back
