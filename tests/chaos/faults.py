"""What the chaos suite injects and when: each fault is due once the study has launched some number of jobs
(retries included), after a delay, on a target that reached a given step."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from tests.chaos.settings import SoakSettings

FAULT_KINDS = ("kill_job", "stop_job", "kill_driver", "restart_pg")


@dataclass
class Fault:
    kind: str  # one of FAULT_KINDS
    after_starts: int  # due once the study has launched this many jobs (retries included) ...
    delay_s: float = 0.0  # ... and this long after that
    # Job faults: the target job has logged at least this step (0: start-up counts); restart_pg: some job has.
    min_step: int = 0
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
