"""Starting trials: one on every free slot while the budget (and the search space) lasts, and a settled trial's slot back.

The driver calls `start_within_budget` each pass of its loop and `free_slot` for each trial it settled; a trial
started here joins the driver's `running` dict. A machine found gone before a launch is handed back to the driver
(it pauses the study, then calls `new_slots`).
Invariant: a slot taken is held by a running trial or handed back; a failed draw or launch hands it back too.
"""

from __future__ import annotations

import functools
import logging

import optuna

from storage import trial_id_of
from storage.trial_record import TrialLaunch
from sweeps.launchers.interrupts import signals_held
from sweeps.launchers.slots import SlotPool
from sweeps.search.draw import Draw, draw_within_budget, failed_unless_started
from sweeps.search.space import SearchSpace
from sweeps.trials.preemption import set_aside_unstarted
from sweeps.trials.running import RunningTrial
from sweeps.trials.trial_runner import TrialRunner

log = logging.getLogger("sweeps")


class TrialStarts:
    """The study's slots and its draws within budget, over the TrialRunner of the open study."""

    def __init__(self, trials: TrialRunner, space: SearchSpace, running: dict[int, RunningTrial]):
        self.trials = trials
        self.space = space
        self.running = running  # the driver's: each trial started here is added to it
        self.exhausted = False  # the sampler keeps drawing configurations the study already has

    @functools.cached_property
    def pool(self) -> SlotPool:
        """Where trials run (sweeps/launchers/slots.py): one per slot of launcher.slots, at most max_concurrent at once."""
        return SlotPool(self.trials.launcher.slots(), self.trials.sweep.max_concurrent)

    def new_slots(self) -> None:
        """The slots of the machine as it is now (a retired VM is new), after a pause."""
        self.__dict__.pop("pool", None)

    def start_within_budget(self) -> str | None:
        """Start a trial on every free slot until the budget (or the search space) is spent. Returns the launcher's
        line when its machine was found gone before a launch (the driver pauses), else None."""
        study, storage, sweep = self.trials.study, self.trials.storage, self.trials.sweep
        gone: str | None = None
        while gone is None and (slot := self.pool.take()) is not None:
            # Ctrl-C waits until a drawn trial's job is ours to stop (sweeps.launchers.interrupts): none is left untracked.
            draw: Draw | None = None
            with signals_held():
                try:  # a failed draw (the database restarting) or launch hands the slot back, or no trial starts again
                    draw = draw_within_budget(study, storage, self.space, sweep.n_trials)
                    self.exhausted = draw.exhausted
                    if draw.trial is None:
                        self.pool.give_back(slot)
                        break
                    if (gone := self.trials.launcher.unavailable()) is not None:  # before each launch
                        self.pool.give_back(slot)
                        set_aside_unstarted(study, storage, draw.trial, gone)
                        continue
                    with failed_unless_started(study, storage, draw.trial):
                        # A retry carries its predecessor's slot (Optuna copies the attributes): back there if free.
                        before = TrialLaunch.of(storage.get_trial(trial_id_of(draw.trial)).user_attrs).slot
                        slot = self.pool.prefer(slot, before)
                        running = self.trials.start_trial(draw.trial, draw.sampled, slot)
                except optuna.exceptions.UpdateFinishedTrialError:
                    # Another driver settled it between our draw and its start (it saw no heartbeat within its
                    # grace) and queued a copy, which a driver will run: this one draws again.
                    self.pool.give_back(slot)
                    log.warning(
                        "trial %s was settled by another driver before it started (no heartbeat within "
                        "heartbeat.grace_s=%g s: raise it on a loaded machine); drawing again",
                        draw.trial.number if draw is not None and draw.trial is not None else "drawn",
                        sweep.heartbeat.grace_s,
                    )
                    continue
                except BaseException:
                    self.pool.give_back(slot)
                    raise
                self.running[running.trial.number] = running
        return gone

    def free_slot(self, running: RunningTrial, code: int) -> None:
        """A settled trial's slot takes the next trial, unless its job failed because its machine is gone."""
        if code != 0 and not self.trials.launcher.slot_alive(running.slot):
            log.warning("%s no longer answers: its slot takes no more trials", running.slot.name)
            self.pool.retire(running.slot)
        else:
            self.pool.give_back(running.slot)
