"""A trial on every worker VM of a Cloud TPU pod through `gcloud compute tpus tpu-vm ssh`.

Each worker has its own log and exit code: when one fails the handle names it and stops the others. Up to
launcher.ssh_sessions VMs each get an ssh session of their own (`--worker=i`); a larger slice's VMs are grouped,
at most that many sessions (sweeps/launchers/tpu/sessions.py). Cancel also runs `pkill` on every VM of the job
(`--worker=all`, one session), because killing the local ssh client does not stop the remote python.

Its knobs and calls to gcloud: sweeps/launchers/tpu/calls.py; its set-up: sweeps/launchers/tpu/setup.py.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
import time
import uuid
from collections.abc import Mapping
from typing import Any

from sweeps.config.schema import SweepConfig
from sweeps.launchers.base import JobSpec, LauncherConfigError, Machine, PreflightReport, worker_env
from sweeps.launchers.job_command import JOB_TAG_KEY, stop_grace
from sweeps.launchers.quoting import quote_literals
from sweeps.launchers.slots import Slot
from sweeps.launchers.tpu.describe import unknown_line, wait_for_ready
from sweeps.launchers.tpu.preflight import preflight as pod_preflight
from sweeps.launchers.tpu.sessions import session_argvs, start_sessions
from sweeps.launchers.tpu.setup import PodSetup
from sweeps.launchers.tpu.shell import (
    chips_free_check,
    job_command,
    job_pattern,
    prepared_check,
    shell_path,
    stop_command,
)
from sweeps.launchers.workers import JobHandle

log = logging.getLogger(__name__)


class TpuPodLauncher(PodSetup):
    """`launcher=tpu_pod`: the Launcher protocol on a Cloud TPU slice (its knobs and calls: PodCalls; its set-up:
    PodSetup). The slice may be taken from the study (a spot preemption): `unavailable` says so, and
    `wait_until_available` waits for it and sets it up anew."""

    # ------------------------------------------------------------------------------------------- the slice

    def machine(self) -> Machine:
        """The slice, for a dry run's header and its price (launcher.accelerator_type's plan in a dry run)."""
        shape = self.shape()
        return Machine(shape.line(), shape.accelerator_type, shape.chips)

    def preflight(self, sweep: SweepConfig, train: Mapping[str, Any] | None = None) -> PreflightReport:
        """The probe on every VM and what its answers show (sweeps/launchers/tpu/preflight.py), once the launcher's
        own config is checked (validate: nothing else is asked of gcloud before it)."""
        self.validate()
        return pod_preflight(sweep, self, train)

    def unavailable(self) -> str | None:
        """Whether the slice is gone, asked afresh: a state other than READY, an unhealthy `health` or NOT_FOUND
        (a spot slice may be PREEMPTED at any time). A describe that fails otherwise (5xx, 429, a timeout, a
        reauth) says nothing about the slice: logged, and None, so the study goes on."""
        answer = self.ask()
        if answer.error is not None:
            log.warning("%s: taken as still usable", unknown_line(str(self.tpu_name), answer, self.describe_attempts))
            return None
        return answer.gone(str(self.tpu_name))

    def watch(self) -> str | None:
        """While trials run: the slice asked afresh every launcher.watch_s, as `unavailable` asks it (an API error
        says nothing), so a maintenance event, a spot notice's stop or a deleted slice is noticed while its jobs
        still run or hang, not only once one of them ends."""
        if not self.watch_s or time.monotonic() - self.watched_at < self.watch_s:
            return None
        self.watched_at = time.monotonic()
        return self.unavailable()

    def wait_until_available(self, line: str) -> None:
        """Wait for READY (launcher.on_preempted), then prepare the slice anew: a recreated one has fresh VMs, new
        addresses, and none of the setup, venv or code the old ones had; no job of ours may still run there. A
        prepare or check that fails (a fresh VM's ssh not up yet, a VM gone under a slice that still reads READY,
        chips still held) waits and tries again, from the slice's state, until launcher.recover_timeout_s has passed
        since the slice first read READY; then its error ends the driver."""
        ready_since: float | None = None
        while True:
            wait_for_ready(line, self.not_ready, self.on_preempted, self.state_poll_s)
            ready_since = time.monotonic() if ready_since is None else ready_since
            log.warning("the slice is READY: setting up its VMs anew (launcher.setup, the Python check, deploy)")
            self._shape = None
            try:
                self.prepare()
                # The pause stopped every job of ours: a training process still there would hold the chips.
                self._run_all(chips_free_check(None), "checking that no job of ours still runs on the VMs")
                return
            except LauncherConfigError as err:
                if time.monotonic() - ready_since > self.recover_timeout_s:
                    raise
                line = f"slice {self.tpu_name}: setting up its VMs failed ({str(err)[:300]})"
                log.warning("%s: trying again in %g s (launcher.recover_timeout_s)", line, self.state_poll_s)
                time.sleep(self.state_poll_s)

    # ---------------------------------------------------------------------------------------- launching

    # The chips' processes are the pod runtime's (the job's own batch check counts them); the VMs are remote.
    world_size = 1
    shares_filesystem = False

    def describe(self, spec: JobSpec) -> str:
        """The ssh sessions `launch` starts for the job (at most launcher.ssh_sessions): the first in full, then
        the workers of each other one, which runs the same command."""
        vms = list(spec.slot.workers) or self.worker_ids()
        (_, ssh), *others = session_argvs(vms, self.ssh_sessions, self.ssh_argv, self.remote_command(spec))
        shown = shlex.join(ssh)
        if others:
            rest = " ".join("--worker=" + ",".join(map(str, group)) for group, _ in others)
            shown += f"\n  and {len(others)} more session(s), the same job on {rest}"
        return shown

    def slot_alive(self, slot: Slot) -> bool:
        """Whether every VM of the slot still answers ssh, was set up by the latest prepare (its id there: a VM
        recreated under a slice that still reads READY has none) and no process of an earlier job still holds the
        slot's chips (a failed or stopped job on a dead VM, or one that outlived its stop, retires only its slots;
        with slots=pod the study pauses and prepares the slice again: sweeps/trials/preemption.py)."""
        workers = ",".join(map(str, slot.workers)) if slot.workers else "all"
        check = chips_free_check(slot.env.get("TPU_VISIBLE_CHIPS"))
        if self.prepare_id is not None:
            check = f"{prepared_check(self.remote_dir, self.prepare_id)}; {check}"
        try:
            proc = subprocess.run(
                self.ssh_argv(workers, check), check=False, capture_output=True, text=True, timeout=self.ssh_timeout_s
            )
        except subprocess.TimeoutExpired:
            return False
        if proc.returncode == 1 and ("still runs" in proc.stdout or "not set up" in proc.stdout):
            found = proc.stdout.strip().replace("\n", "; ")
            log.warning("slot %s failed its check after its job failed: %s; %s", slot.name, found, after_check(slot))
        return proc.returncode == 0

    def remote_command(self, spec: JobSpec) -> str:
        env = {**self.env, **spec.slot.env, **spec.env}
        exports = " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items())
        overrides = [*spec.overrides, stop_grace(self.kill_grace_s), f"{JOB_TAG_KEY}={spec.name}"]
        train = shlex.join(["-m", "trm.train", *quote_literals(overrides)])
        here = shell_path(self.remote_dir)
        job = f"{exports} {shell_path(self.python)} {train}".strip()
        return job_command(f"mkdir -p {here} && cd {here}", job, launch_id=uuid.uuid4().hex[:16])

    def cancel_command(self, spec: JobSpec, grace_s: float | None = None) -> str:
        """Stop the job's processes on its VMs: SIGTERM, then SIGKILL after `grace_s` (launcher.kill_grace_s)."""
        job = quote_literals([f"{JOB_TAG_KEY}={spec.name}"])[0]  # as it stands on their command lines
        return stop_command(job_pattern(job), self.kill_grace_s if grace_s is None else grace_s)

    def launch(self, spec: JobSpec) -> JobHandle:
        vms = list(spec.slot.workers) or self.worker_ids()
        env = worker_env(spec, with_slot=False)  # the slot's environment goes in the remote command
        workers = start_sessions(vms, self.ssh_sessions, self.ssh_argv, self.remote_command(spec), spec.workdir, env)
        cancel_on = ",".join(map(str, spec.slot.workers)) if spec.slot.workers else "all"
        return JobHandle(
            workers,
            remote_cancel=lambda grace_s: self._run_on(
                cancel_on, self.cancel_command(spec, grace_s), "stopping the job", self.ssh_timeout_s + grace_s + 10
            ),
            grace_s=self.kill_grace_s,
        )


def after_check(slot: Slot) -> str:
    """What the driver does once `slot_alive` found `slot` unfit (sweeps/trials/preemption.py, TrialStarts.free_slot)."""
    if slot.whole:  # slots=pod: the slice's only slot
        return (
            "the study pauses: the job's trial is queued again (no retry spent), and the slice's VMs are set up again "
            "and checked (no job of ours left on them) before the next trial, for up to launcher.recover_timeout_s"
        )
    return "this slot takes no more trials; the study goes on on the slice's other slots"
