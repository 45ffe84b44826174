"""`python -m sweeps.run study=NAME [site=pod] [storage=postgres] [launcher=...] [n_trials=...] [dry_run=true]`"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections import Counter

import hydra
import optuna
from hydra.errors import HydraException
from omegaconf import DictConfig, MissingMandatoryValue
from omegaconf.errors import OmegaConfBaseException
from optuna.trial import TrialState

from contracts.hydra_app import CONFIG_PATH, HYDRA_CALLBACKS, run_app
from storage import redact
from storage.errors import UserError, permission_denied
from storage.heartbeat import retried_numbers
from storage.record import FAIL_REASON_ATTR, trained_trials
from sweeps.config import estimate
from sweeps.config.help import help_text
from sweeps.config.schema import SweepConfig
from sweeps.config.typed_config import composition_error_line, typed_sweep
from sweeps.driver import Driver
from sweeps.launchers.base import JobSpec, MachineUnavailableError
from sweeps.launchers.interrupts import ignore_stop_signals, interrupt_once
from sweeps.launchers.slots import SLOT_CHOICES, NoSlotLeftError, SlotConfigError
from sweeps.search.space import to_overrides
from sweeps.trials.outcome import clip_line
from sweeps.trials.preemption import PREEMPTED_EXIT
from sweeps.trials.retry import without_note

FULL_ERROR = "HYDRA_FULL_ERROR"
USERS_FULL_ERROR: dict[str, str | None] = {}  # its value before _entry set it, for main to put back
# What a user fixes: one line and exit 2 (UserError, storage/errors.py: the root of every such error of the
# project's packages; and OmegaConf's own missing value).
CONFIG_ERRORS = (UserError, MissingMandatoryValue)


def dry_run(driver: Driver) -> None:
    """Print the command of each of the first n_trials trials, sampled in memory: nothing is stored or run."""
    sweep = driver.sweep
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=sweep.seed), directions=["maximize"])
    print(
        f"# study {sweep.study.name} ({sweep.scale} scale), storage {redact(driver.storage_url)}, launcher {str(sweep.launcher['_target_']).rsplit('.', 1)[-1]}"
    )
    pods = dict(sweep.estimate.pods)
    machine = driver.launcher.machine()  # a TPU slice, as `tpu-vm describe` gives it; None: this machine
    if machine is not None:
        print(f"# {machine.line}")
        pods.setdefault(machine.accelerator_type, machine.chips)
    slot = driver.launcher.slots()[0]  # the first trial's: its own overrides (a pod's device count) are shown
    trials = []
    for _ in range(sweep.n_trials):
        trial = study.ask()
        sampled = driver.space.sample(trial)
        workdir = driver.roots.workdir(trial.number)
        spec = JobSpec(
            f"{sweep.study.name}-{trial.number}",
            driver.trials.jobs.job_command(trial.number, sampled, trial.number, slot=slot).overrides(),
            workdir,
            slot=slot,
        )
        trials.append((trial.number, sampled, spec))
        study.tell(trial, 0.0)
    costs = []
    if sweep.estimate.enabled:  # every trial's model priced from its FLOPs (trm.info, one process)
        costs = estimate.trial_costs([[*driver.base_overrides, *to_overrides(sampled)] for _, sampled, _ in trials])
    utilization = estimate.Utilization.parse(sweep.estimate.utilization)  # checked by the schema already
    for i, (number, sampled, spec) in enumerate(trials):
        print(f"trial {number}: {' '.join(to_overrides(sampled))}")
        print("  " + describe_command(driver, spec))
        if costs:
            print("  cost: " + estimate.describe(costs[i], pods, sweep.estimate.peak_tflops, utilization))
    if costs:
        print("# study cost: " + estimate.describe_total(costs, pods, sweep.estimate.peak_tflops, utilization))
        print_packings(driver, costs, utilization)
    if sweep.confirm.at_end:  # the top configurations trained again after the study (sweeps/trials/confirm.py)
        print(confirm_cost_line(sweep, costs, pods, utilization))


def confirm_cost_line(
    sweep: SweepConfig, costs: list[estimate.Cost], pods: dict[str, int], utilization: estimate.Utilization
) -> str:
    """The confirm stage's cost: top_k x seeds trainings like trials, priced (where the trials were) as the costliest
    trials of the study, an upper bound: which configurations it confirms is known only at the end."""
    settings = sweep.confirm
    jobs = settings.top_k * settings.seeds
    line = (
        f"# confirm stage (confirm.at_end): top {settings.top_k} configurations x {settings.seeds} fresh seed(s) = "
        f"{jobs} training job(s) after the study, {jobs / sweep.n_trials:.0%} of its n_trials={sweep.n_trials}"
    )
    if not costs:
        return line
    costliest = sorted(costs, key=lambda c: c.flops_per_sample_step * c.global_batch * c.steps, reverse=True)
    priced = [costliest[i % len(costliest)] for i in range(jobs)]
    hours = estimate.describe_hours(priced, pods, sweep.estimate.peak_tflops, utilization)
    return f"{line}; at most {hours} (priced as the study's costliest trials)"


def print_packings(driver: Driver, costs: list[estimate.Cost], utilization: estimate.Utilization) -> None:
    """The study priced on each way the launcher can divide its machines (launcher.slots), so a user can choose."""
    options = {}
    for kind in SLOT_CHOICES:
        try:
            slots = driver.launcher.slots(kind)
        except SlotConfigError:
            continue  # this launcher's machines do not divide that way
        if slots[0].chips:
            options[kind] = (len(slots), int(slots[0].chips))
    if options:
        rows = estimate.packings(costs, options, driver.sweep.estimate.peak_tflops * 1e12, utilization)
        print("\n".join(estimate.describe_packings(rows, utilization)))


def exit_for(err: Exception) -> tuple[int, str] | None:
    """The exit code and error line a study's driver ends with on `err`; None where it is not one of ours (Hydra's
    handler prints its traceback)."""
    if isinstance(err, MachineUnavailableError | NoSlotLeftError):  # the machine is gone: the trials were queued
        return PREEMPTED_EXIT, str(err)  # again (launcher.on_preempted=exit), or every slot of it stopped answering
    if isinstance(err, CONFIG_ERRORS):
        return 2, str(err)
    denied = permission_denied(err)  # a role without a privilege the study needs: Optuna's error names neither
    return None if denied is None else (2, denied)


def interrupted_exit(signal_name: str) -> int:
    """The shell's convention for a process its signal stopped: 128 + the signal's number (130 for SIGINT, 143 for
    SIGTERM: a scheduler or `timeout` reads which); 130 for an interrupt that names none."""
    try:
        return 128 + signal.Signals[signal_name].value
    except KeyError:
        return 128 + signal.SIGINT.value


def describe_command(driver: Driver, spec: JobSpec) -> str:
    return driver.launcher.describe(spec)


@hydra.main(config_path=CONFIG_PATH, config_name="sweep", execution_whitelist=HYDRA_CALLBACKS)
def main(cfg: DictConfig) -> None:
    _restore(FULL_ERROR, USERS_FULL_ERROR.pop(FULL_ERROR, None))  # composed: Hydra reports as the user asked again
    logging.getLogger("sweeps").setLevel(logging.INFO)
    # Ctrl-C or SIGTERM stops our jobs and records their trials; a second one cannot cut that short.
    interrupt_once()
    try:
        driver = Driver(typed_sweep(cfg))  # the DictConfig stops here: below, the typed SweepConfig
        if driver.sweep.dry_run:
            driver.validate()
            dry_run(driver)
            return
        study = driver.run()
    except Exception as err:
        ended = exit_for(err)
        if ended is None:
            raise
        print(f"error: {ended[1]}", file=sys.stderr)
        sys.exit(ended[0])
    except KeyboardInterrupt as why:  # the driver stopped its jobs and recorded their trials: one line, no traceback
        ignore_stop_signals()  # the stop is done: another Ctrl-C must not turn exit 130 into death by SIGINT
        print(
            f"interrupted ({why or 'SIGINT'}): every job stopped; run the same command to continue the study",
            file=sys.stderr,
        )
        sys.exit(interrupted_exit(str(why)))
    failure = all_failed(study)
    if failure:
        print(f"error: {failure}", file=sys.stderr)
        sys.exit(1)


def _restore(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def all_failed(study: optuna.Study) -> str | None:
    """Why the study has nothing to show: every trial that ran failed (None when any completed or was pruned).
    A driver that exits 0 after that would tell a script or a scheduler that the sweep worked."""
    trials = study.get_trials(deepcopy=False)
    ran = trained_trials(trials)
    if not ran or any(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in ran):
        return None
    retried = retried_numbers(trials)  # an attempt whose retry stands for it: each chain counts once
    reasons = Counter(
        clip_line(
            without_note(next(iter(str(t.user_attrs.get(FAIL_REASON_ATTR) or "no reason recorded").splitlines()), "")),
            200,
        )
        for t in ran
        if t.state == TrialState.FAIL and t.number not in retried
    )
    if not reasons:
        return None
    most, count = reasons.most_common(1)[0]
    attempts = sum(1 for t in ran if t.state == TrialState.FAIL)
    tried = f" ({attempts} attempts with retries)" if attempts > sum(reasons.values()) else ""
    return (
        f"study {study.study_name!r}: all {sum(reasons.values())} trials failed{tried}; most often ({count}x): {most}"
    )


def cli() -> None:
    """The `trm-sweep` console script."""
    _entry()


def _entry() -> None:
    if {"--help", "-h"} & set(sys.argv[1:]):  # the sweep's groups, not every group on the search path
        run_app(lambda: print(help_text()))  # run_app: a reader that stops early (| head) ends it quietly
        return
    # Hydra prints an error composing the config over several lines and exits 1; raised instead (HYDRA_FULL_ERROR,
    # only until main starts: a trial's job must not inherit it) it is one line here, and exit 2 as every bad input.
    USERS_FULL_ERROR[FULL_ERROR] = os.environ.get(FULL_ERROR)
    os.environ[FULL_ERROR] = "1"
    try:
        run_app(main)
    except (HydraException, OmegaConfBaseException) as err:
        print(f"error: {composition_error_line(err)}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    _entry()
