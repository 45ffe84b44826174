"""What a run resumes from: the training state, its checkpoint layout (capture/restore side by side), and the
collective save and resume around trm/checkpoint.py's files.

A checkpoint is one dict (trm/checkpoint.py writes and reads it atomically):

    step        steps done                     model       the weights (state_dict)
    ema         the EMA's state_dict or None   optimizers  one state_dict per optimizer
    loader      the data position              ranks       every rank's {"carry": {...} on CPU, "rng": CPU RNG}
    carry       SPMD (xla) only: the global carry on CPU, once; `ranks` then holds each rank's "rng" alone
    train_sums  metric sums since the last log point (CPU)
    best        the best eval so far: {"value", "step", "metrics"}
    last_eval   the latest eval's metrics      identity    what wrote it (checkpoint.IDENTITY)
    best_file   what best.pt holds (trm/best_file.py)

Rank 0 alone reads and writes the files (only it may see the path); every rank restores its own carry and RNG.
For a remote checkpoint.url rank 0 writes a local copy and uploads it in the background (trm/checkpoint_upload.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.swa_utils import AveragedModel

from trm import best_file, checkpoint, checkpoint_upload
from trm.checkpoint_upload import CheckpointSettings
from trm.data.loader import TrainLoader
from trm.model import ACTModel, Carry
from trm.run_end import NonFiniteLossError, Outcome
from trm.runtime.base import Runtime


@dataclass
class Best:
    """The best eval so far by the run's objective (`train.objective`, in `train.objective_direction`)."""

    maximize: bool
    value: float
    step: int | None = None  # None: no eval yet
    metrics: dict[str, float] = field(default_factory=dict)

    @classmethod
    def start(cls, direction: str) -> Best:
        """Nothing yet: the worst value in `direction` (maximize or minimize: the schema's train.objective_direction)."""
        maximize = direction == "maximize"
        return cls(maximize=maximize, value=-math.inf if maximize else math.inf)

    @property
    def found_value(self) -> float | None:
        """The best value, or None before the first eval."""
        return self.value if self.step is not None else None

    def update(self, value: float, step: int, metrics: dict[str, float]) -> bool:
        """Keep the eval at `step` if its `value` is better (a NaN never is); True if it was."""
        improved = value > self.value if self.maximize else value < self.value
        if improved:
            self.value, self.step, self.metrics = value, step, metrics
        return improved

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "step": self.step, "metrics": self.metrics}

    def load(self, saved: Mapping[str, Any]) -> None:
        self.value, self.step, self.metrics = saved["value"], saved["step"], saved["metrics"]


@dataclass
class TrainState:
    """Everything a checkpoint holds, live: the loop updates `step`, `carry`, `train_sums`, `best`, `last_eval`."""

    model: ACTModel
    optimizers: list[Optimizer]
    ema: AveragedModel | None
    loader: TrainLoader
    identity: dict[str, Any]  # {"config": training_identity(cfg), "data": fingerprint}: what may resume it
    best: Best
    train_sums: Tensor  # on the device: read only at log points
    step: int = 0
    carry: Carry | None = None  # None until the first step builds it from the first batch
    last_eval: dict[str, float] = field(default_factory=dict)
    best_file: best_file.BestFile = field(default_factory=best_file.BestFile)  # what best.pt holds
    uploads: checkpoint_upload.Uploads = field(default_factory=checkpoint_upload.Uploads)  # rank 0's, in flight

    def carry_on_cpu(self, runtime: Runtime) -> dict[str, Tensor]:
        """The carry moved to the CPU (collective under multi-host SPMD: runtime.to_cpu)."""
        if self.carry is None:
            raise RuntimeError("no carry to save before the first step")
        return runtime.to_cpu(self.carry._asdict())

    def rank_state(self, runtime: Runtime) -> dict[str, Any]:
        """This rank's part: its carry and RNG, so a resumed job continues exactly where each rank was."""
        return {"carry": self.carry_on_cpu(runtime), "rng": torch.get_rng_state()}

    def capture(self, ranks: list[dict[str, Any]], carry: dict[str, Tensor] | None = None) -> dict[str, Any]:
        """The checkpoint (rank 0), given every rank's `rank_state` (under SPMD: every rank's RNG, and the global
        `carry` once)."""
        return {
            "step": self.step,
            "model": self.model.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "optimizers": [opt.state_dict() for opt in self.optimizers],
            "loader": self.loader.state_dict(),
            "ranks": ranks,
            "carry": carry,
            "train_sums": self.train_sums.cpu(),
            "best": self.best.to_dict(),
            "last_eval": self.last_eval,
            checkpoint.IDENTITY: self.identity,
            best_file.KEY: self.best_file.to_dict(),
        }

    def restore(self, saved: Mapping[str, Any], rank: int, device: torch.device) -> None:
        """Continue from `saved` (a `capture`) as rank `rank`: weights, optimizers, data position, this rank's
        carry and RNG, the sums since the last log point, the best so far and the latest eval."""
        self.model.load_state_dict(saved["model"])
        for opt, opt_state in zip(self.optimizers, saved["optimizers"]):
            opt.load_state_dict(opt_state)
        if self.ema is not None and saved.get("ema") is not None:
            self.ema.load_state_dict(saved["ema"])
        self.loader.load_state_dict(saved["loader"])
        mine = saved["ranks"][rank]
        carry: Mapping[str, Tensor] = saved.get("carry") or mine["carry"]  # SPMD's global carry, saved once
        self.carry = Carry(**{k: v.to(device) for k, v in carry.items()})
        torch.set_rng_state(mine["rng"])
        self.step = saved["step"]
        self.best.load(saved["best"])
        self.best_file = best_file.BestFile.of(saved)
        self.train_sums = saved["train_sums"].to(device)
        # A run resumed at its last step (its job finished, then its outcome was lost) trains nothing more:
        # its final eval is the one in the checkpoint, so the value a sweep reads is still that training's.
        self.last_eval = saved.get("last_eval") or {}


def resume(runtime: Runtime, state: TrainState, url: str, check_best: bool = True) -> None:
    """Restore `state` from the checkpoint at `url` if there is one (collective).

    Rank 0 reads it: latest.pt, or previous.pt (with a warning naming both) when latest.pt cannot be read, and
    hands it to every rank. If neither can be read, every rank raises rank 0's error, naming the files; a
    checkpoint another run wrote is refused (checkpoint.check_identity). With `check_best`, rank 0 checks best.pt
    and repairs or names it (best_file.check_on_resume); every rank gets what it then holds."""
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
        state.restore(saved, runtime.rank, runtime.device)
        if check_best:
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


def save(runtime: Runtime, state: TrainState, settings: CheckpointSettings, best: bool) -> None:
    """Write latest.pt, and best.pt too if `best`, to `settings.url` (collective: every rank sends its carry and RNG).

    Rank 0 refuses to save non-finite weights (the last good checkpoint stays) and writes atomically, or, when saves
    are staged (checkpoint_upload.staged), writes a local copy and starts its upload after the one in flight ended;
    if it could not save, or the previous upload failed, every rank raises its error, so all stop together."""
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
            write(state.capture(ranks, carry), settings, best, state.uploads)
        except (checkpoint.CheckpointError, NonFiniteLossError) as err:
            failure = (isinstance(err, NonFiniteLossError), str(err))
    failure = runtime.broadcast_object(failure)
    if failure is not None:
        non_finite, message = failure
        raise (NonFiniteLossError if non_finite else checkpoint.CheckpointError)(message)


def write(
    captured: dict[str, Any], settings: CheckpointSettings, best: bool, uploads: checkpoint_upload.Uploads
) -> None:
    """Rank 0's part of `save`: write the checkpoint `captured` to latest.pt (and best.pt), directly or staged and
    uploaded by `uploads`; CheckpointError if it could not, or if the previous upload failed."""
    data = checkpoint.encode(captured)  # here, not on the upload's thread: `captured` shares the live weights
    names = [checkpoint.LATEST, checkpoint.BEST] if best else [checkpoint.LATEST]
    if not checkpoint_upload.staged(settings):
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
    staged = checkpoint.put(settings.local_dir, checkpoint_upload.STAGED, data)
    uploads.start(settings.url, captured["step"], Path(staged), names)


def finish(runtime: Runtime, state: TrainState, settings: CheckpointSettings) -> list[int]:
    """The end of training (collective), after its last save: rank 0 waits for the upload in flight (at most
    checkpoint.upload_wait_s); if it failed or is still running, every rank raises a CheckpointError naming it.
    Returns every rank's step (proof that all stopped at the same one)."""
    late = state.uploads.wait(settings.upload_wait_s) if runtime.is_main else None
    everyone = runtime.all_gather_object((state.step, late))
    if everyone[0][1] is not None:
        raise checkpoint.CheckpointError(everyone[0][1])
    return [step for step, _ in everyone]


def failed(state: TrainState, settings: CheckpointSettings, outcome: Outcome, err: BaseException) -> None:
    """Record in `outcome` why the run failed, once an upload in flight (rank 0's) has landed, waiting at most
    checkpoint.upload_wait_s (a retry resumes from the newest complete checkpoint); an upload that failed or did
    not land is named in the record too."""
    late = state.uploads.wait(settings.upload_wait_s)
    outcome.failed(err)
    if late is not None:
        outcome.error = f"{outcome.error}; and {late}"
