"""A run's checkpoints behind one object, `Checkpointer`, built once per run with the runtime, the live training
state and the `checkpoint` settings (url, keep_best, staging, local_dir, upload_wait_s): the trainer's saves name
none of them (torchtitan's CheckpointManager beside its trainer).

- `resume`: continue from the checkpoint at checkpoint.url, if there is one; best.pt checked with keep_best.
- `takes_best`, `save`: latest.pt at every save, best.pt too at an eval that takes it.
- `finish`: the end of training, after its last save: the upload in flight has landed.
- `failed`: an error ends the run: why, once the upload in flight has landed (or its grace ended).
- `stop_from`: a SIGTERM came (a preemption notice, a launcher's stop): the stop's save and upload end within
  checkpoint.stop_grace_s of it, or the save is cut and the last uploaded checkpoint kept.

Every method but `takes_best` and `failed` is collective: every rank calls it at the same step. Rank 0 alone reads
and writes the files (only it may see the path); every rank restores its own carry and RNG. For a remote
checkpoint.url rank 0 writes a local copy and uploads it in the background (trm/checkpoints/upload.py).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from trm.checkpoints import best_file, checkpoint, upload
from trm.checkpoints.upload import CheckpointSettings
from trm.run_end import NonFiniteLossError, Outcome
from trm.runtime.base import Runtime
from trm.train_state import TrainState


class CheckpointerSettings(CheckpointSettings, Protocol):
    """The `checkpoint` block of the training config (contracts/train_config.py CheckpointConfig) a run's
    checkpoints read: where and how saves go (CheckpointSettings), and whether best.pt is kept."""

    keep_best: bool
    stop_grace_s: float | None


# What a stop keeps of its kill grace for after the save and upload (the summary, the tracker's close, the exit): a
# quarter of the grace, at most 10 s. The pod's 120 s keep 10 s; the local launchers' 10 s keep 2.5 s, not all of it.
STOP_EXIT_SHARE, STOP_EXIT_S = 0.25, 10.0


def exit_reserve(grace_s: float) -> float:
    """The seconds of a stop's kill grace `grace_s` kept for the exit after its save and upload."""
    return min(STOP_EXIT_S, STOP_EXIT_SHARE * grace_s)


class Checkpointer:
    """Every checkpoint file `state` is saved to or resumed from, at `settings.url`."""

    def __init__(self, runtime: Runtime, state: TrainState, settings: CheckpointerSettings) -> None:
        self.runtime, self.state, self.settings = runtime, state, settings
        self.uploads = upload.Uploads()  # rank 0's, in flight
        self.deadline: float | None = None  # time.time() by which a stop's save and upload end (`stop_from`)

    def stop_from(self, notice_at: float) -> None:
        """A SIGTERM came at `notice_at` (time.time(); the earliest of every rank's): with checkpoint.stop_grace_s,
        the stop's save and upload end by `notice_at` + the grace less its exit_reserve (`save` cuts the save when its
        upload would not land by then; `finish` waits no longer)."""
        grace = self.settings.stop_grace_s
        if grace is not None:
            self.deadline = notice_at + grace - exit_reserve(grace)

    def _wait_s(self) -> float:
        """How long a stop waits for the upload in flight: checkpoint.upload_wait_s, and no later than the deadline."""
        if self.deadline is None:
            return self.settings.upload_wait_s
        return max(0.0, min(self.settings.upload_wait_s, self.deadline - time.time()))

    def resume(self) -> None:
        """Restore the state from the checkpoint at checkpoint.url if there is one (collective).

        Rank 0 reads it: latest.pt, or previous.pt (with a warning naming both) when latest.pt cannot be read, and
        hands it to every rank. If neither can be read, every rank raises rank 0's error, naming the files; a
        checkpoint another run wrote is refused (checkpoint.check_identity). With checkpoint.keep_best, rank 0
        checks best.pt and repairs or names it (best_file.check_on_resume); every rank gets what it then holds."""
        runtime, state, url = self.runtime, self.state, self.settings.url
        saved, failure = None, None
        if runtime.is_main:
            try:
                saved = checkpoint.load_latest(url)
            except checkpoint.CheckpointError as err:
                failure = err
        saved, failure = runtime.broadcast_object((saved, failure))
        if failure is not None:
            raise failure
        if saved is not None:
            checkpoint.check_identity(saved, state.identity, f"{url.rstrip('/')}/{checkpoint.LATEST}")
            state.restore(saved, runtime.rank, runtime.device, runtime.world_size)
            if self.settings.keep_best:
                checked, failure = None, None
                if runtime.is_main:
                    try:
                        checked = best_file.check_on_resume(url, saved)
                    except checkpoint.CheckpointError as err:
                        failure = err
                checked, failure = runtime.broadcast_object((checked, failure))
                if failure is not None:
                    raise failure
                state.best_file = checked

    def takes_best(self, value: float, step: int, improved: bool) -> bool:
        """Whether the save of the eval at `step` (its objective `value`; `improved`: a new best of the run) writes
        best.pt too: never without checkpoint.keep_best; else as best_file.BestFile.takes, which records it."""
        return self.settings.keep_best and self.state.best_file.takes(value, step, improved, self.state.best.maximize)

    def save(self, best: bool = False) -> None:
        """Write latest.pt, and best.pt too if `best` (collective: every rank sends its carry and RNG).

        Rank 0 refuses to save non-finite weights (the last good checkpoint stays) and writes atomically, or, when
        saves are staged (upload.staged), writes a local copy and starts its upload after the one in
        flight ended; if it could not save, or the previous upload failed, every rank raises its error, so all stop
        together."""
        runtime, state = self.runtime, self.state
        if self.deadline is not None:
            cut = runtime.broadcast_object(self._cut() if runtime.is_main else None)  # every rank saves, or none
            if cut is not None:
                failed, message = cut
                if failed:
                    raise checkpoint.CheckpointError(message)
                if runtime.is_main:
                    print(f"warning: {message}", file=sys.stderr, flush=True)
                return
        # Every rank runs the work still pending (the step's sums since the last log point) together: under
        # multi-host SPMD a computation forced on rank 0 alone waits for hosts that never join it.
        runtime.step_boundary()
        ranks, carry = gather_carry(runtime, state)
        # On every rank: under multi-host SPMD (XLA) a computation over the replicated weights runs on all hosts or
        # waits for the missing ones. One reduction, one read back.
        finite = bool(torch.stack([torch.isfinite(p).all() for p in state.model.parameters()]).all())
        failure: tuple[bool, str] | None = None  # (non-finite weights?, message)
        if runtime.is_main:
            try:
                if not finite:
                    raise NonFiniteLossError(
                        f"non-finite weights at step {state.step}: no checkpoint written (the last good one is kept)"
                    )
                write(runtime.to_cpu_tree(state.capture(ranks, carry)), self.settings, best, self.uploads)
            except (checkpoint.CheckpointError, NonFiniteLossError) as err:
                failure = (isinstance(err, NonFiniteLossError), str(err))
        failure = runtime.broadcast_object(failure)
        if failure is not None:
            non_finite, message = failure
            raise (NonFiniteLossError if non_finite else checkpoint.CheckpointError)(message)

    def _cut(self) -> tuple[bool, str] | None:
        """Rank 0, before a save with a deadline: wait for the upload in flight until the deadline; (True, why) if it
        did not land, (False, why) when the save would not land by the deadline either (its upload would take the
        last one's time), None to save."""
        late = self.uploads.wait(self._wait_s())
        if late is not None:
            return True, late
        left, need, grace = self._wait_s(), self.uploads.last_s, self.settings.stop_grace_s or 0.0
        if need is None or need <= left:
            return None
        return False, (
            f"the stop's checkpoint of step {self.state.step} was not written: {left:.1f} s were left of "
            f"checkpoint.stop_grace_s={grace:g} (less {exit_reserve(grace):g} s for the exit) and the last "
            f"upload took {need:.1f} s; the last uploaded checkpoint at {self.settings.url} is kept. Raise "
            "launcher.kill_grace_s (the job's checkpoint.stop_grace_s), or save more often (train.eval_interval)"
        )

    def finish(self) -> list[int]:
        """The end of training (collective), after its last save: rank 0 waits for the upload in flight (at most
        checkpoint.upload_wait_s); if it failed or is still running, every rank raises a CheckpointError naming it.
        Returns every rank's step (proof that all stopped at the same one)."""
        late = self.uploads.wait(self._wait_s()) if self.runtime.is_main else None
        everyone = self.runtime.all_gather_object((self.state.step, late))
        if everyone[0][1] is not None:
            raise checkpoint.CheckpointError(everyone[0][1])
        return [step for step, _ in everyone]

    def failed(self, outcome: Outcome, err: BaseException) -> None:
        """Record in `outcome` why the run failed, once an upload in flight (rank 0's) has landed, waiting at most
        checkpoint.upload_wait_s (a retry resumes from the newest complete checkpoint); an upload that failed or did
        not land is named in the record too."""
        late = self.uploads.wait(self._wait_s())
        outcome.failed(err)
        if late is not None:
            outcome.error = f"{outcome.error}; and {late}"


def gather_carry(runtime: Runtime, state: TrainState) -> tuple[list[dict[str, Any]], dict[str, Tensor] | None]:
    """Every rank's part of a checkpoint (collective): the `ranks` list and, under SPMD, the global carry.

    With DDP each rank's carry is its own: each is moved to the CPU and gathered. Under SPMD (xla) the carry is one
    global tensor, the same value on every process: it is moved to the CPU once (every process takes part, as a
    multi-host transfer needs) and rank 0 keeps it; only the RNG states are gathered, so no rank sends, and rank 0
    does not hold, the global carry once per process."""
    if not runtime.global_tensors:
        return runtime.all_gather_object(state.rank_state(runtime)), None
    carry = state.carry_on_cpu(runtime)
    rngs = runtime.all_gather_object(torch.get_rng_state())
    return [{"rng": rng} for rng in rngs], (carry if runtime.is_main else None)


def write(captured: dict[str, Any], settings: CheckpointSettings, best: bool, uploads: upload.Uploads) -> None:
    """Rank 0's part of `Checkpointer.save`: write the checkpoint `captured` to latest.pt (and best.pt), directly or
    staged and uploaded by `uploads`; CheckpointError if it could not, or if the previous upload failed."""
    data = checkpoint.encode(captured)  # here, not on the upload's thread: `captured` shares the live weights
    names = [checkpoint.LATEST, checkpoint.BEST] if best else [checkpoint.LATEST]
    if not upload.staged(settings):
        for name in names:
            checkpoint.put(settings.url, name, data)
        return
    # The save waits for the upload in flight rather than superseding it: every save then lands, in order, so
    # previous.pt is always the save before latest.pt and no best.pt is skipped (best_file's record of what best.pt
    # holds stays true). Training blocks only when an upload outlasts an eval interval, and then for the rest of
    # that upload: never longer than the direct write it replaces. Unbounded, as the direct write was: a store that
    # hangs stops the job's progress reports, and the sweep's stall timeout stops the job.
    late = uploads.wait(None)
    if late is not None:
        raise checkpoint.CheckpointError(late)
    staged = checkpoint.put(settings.local_dir, upload.STAGED, data)
    uploads.start(settings.url, captured["step"], Path(staged), names)
