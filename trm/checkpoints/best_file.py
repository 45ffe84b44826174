"""What `best.pt` holds, checked when a run resumes, so that no summary or tool points to a best checkpoint that
cannot be loaded.

`best.pt` is written (trm/checkpoints/checkpoint.py, verified by reading it back) at each new best eval. A run that
resumes loads its `best.pt` too: if it is unreadable, missing or of another step, it is rewritten from the resumed
checkpoint (or `previous.pt`) when that one is the best state itself; otherwise the best weights are gone, the
unreadable file is moved to `best.pt.unreadable`, `best.pt` gets the resumed state and is rewritten at every eval that
beats what it holds ("the next best"), and the run's summary, its trial and the tools say so (`note`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from trm.checkpoints import checkpoint

KEY = "best_file"  # the checkpoint's key holding what best.pt holds (a BestFile as a dict)
log = logging.getLogger(__name__)


@dataclass
class BestFile:
    """best.pt's contents: the step it was written at and its objective value (None: not measured at that
    step); `lost` says why it is not the run's best when it is not (None: it is)."""

    step: int | None = None
    value: float | None = None
    lost: str | None = None

    @classmethod
    def of(cls, saved: Mapping[str, Any]) -> BestFile:
        """What best.pt holds by the checkpoint `saved` (an older checkpoint: its best eval)."""
        if isinstance(saved.get(KEY), dict):
            return cls(**saved[KEY])
        best = saved.get("best") or {}
        return cls(step=best.get("step"), value=best.get("value") if best.get("step") is not None else None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def note(self) -> str | None:
        """One line for the summary, the trial and the tools when best.pt is not the run's best; else None."""
        if self.lost is None:
            return None
        return f"best.pt holds step {self.step}, the best since the run resumed, not the run's best: {self.lost}"

    def takes(self, value: float, step: int, improved: bool, maximize: bool) -> bool:
        """Whether best.pt is to be rewritten with the eval at `step`: a new best of the run (best.pt is the run's
        best again), or an eval better than the stand-in best.pt holds since its best was lost."""
        beats = self.lost is not None and (
            self.value is None or (value > self.value if maximize else value < self.value)
        )
        if improved or beats:
            self.step, self.value = step, value
            self.lost = None if improved else self.lost
        return improved or beats


def _readable(url: str, name: str) -> dict[str, Any] | None:
    try:
        return checkpoint.load(url, name)
    except checkpoint.CheckpointUnreadableError:
        return None


def check_on_resume(url: str, saved: dict[str, Any]) -> BestFile:
    """Check `<url>/best.pt` against what the resumed checkpoint `saved` says it holds; repair or name it (rank 0).

    Returns what best.pt holds afterwards. Rewrites it from `saved` or `previous.pt` when one of them is the state
    it should hold; otherwise moves it aside and writes the resumed state, with `lost` saying what was lost."""
    expected = BestFile.of(saved)
    if expected.step is None:
        return expected  # no eval yet: no best.pt to check
    where = f"{url.rstrip('/')}/{checkpoint.BEST}"
    try:
        found = checkpoint.load(url, checkpoint.BEST)
        problem = "it is missing" if found is None else f"it holds step {found['step']}"
    except checkpoint.CheckpointUnreadableError as err:
        found, problem = None, str(err)
    if found is not None and found["step"] == expected.step:
        return expected
    state = {k: v for k, v in saved.items() if k != checkpoint.LOADED_FROM}
    for source in (state, _readable(url, checkpoint.PREVIOUS)):
        if source is not None and source["step"] == expected.step:
            checkpoint.save(url, checkpoint.BEST, source)
            log.warning("%s (step %s) was not usable (%s): rewritten from the checkpoint of that step",
                        where, expected.step, problem)  # fmt: skip
            return expected
    aside = checkpoint.move_aside(url, checkpoint.BEST)
    lost = f"best.pt of step {expected.step} was not usable ({problem}){aside}"
    stand_in = BestFile(step=saved["step"], value=None, lost=lost)
    checkpoint.save(url, checkpoint.BEST, {**state, KEY: stand_in.to_dict()})
    log.warning("%s: %s", where, stand_in.note)
    return stand_in
