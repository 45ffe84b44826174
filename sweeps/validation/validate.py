"""Validate a sweep before anything runs: one clear error naming the key, the value and what is accepted.

Everything here would otherwise fail every trial (or the driver, after the study was opened and its baseline
trial used up) while the driver itself exits 0. The sweep config's own types, ranges and relations within a block
(the budget, the study definition, heartbeat, draws, reeval, estimate, ...) are its schema's (sweeps/config/schema.py),
checked at composition and when the driver types it (sweeps/config/typed_config.py). What spans configs is here:
  - the search space against the training config: every searched key exists (the training config composed with
    each branch of the space, exactly as a trial would get it) and every range gives values of the key's type;
  - each trial's training config: positive step counts and batch sizes, a batch that splits over the launcher's
    world, a dataset given by path that exists where it can be checked;
  - the sampler and the pruner, built as the driver builds them, with the arguments Optuna accepts at
    construction but fails on later;
  - the machine: the interpreter of a local launcher, an output_root this user can write, and a study storage the
    trials' rank 0 can open from the launcher's workers (no SQLite file where they share no filesystem).

Each check is a short independent function; validate_sweep at the end runs them in order.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from contracts.overrides import override_values
from storage import redact, resolve_url
from storage.url import is_postgres
from sweeps.config.config_values import SweepConfigError
from sweeps.config.schema import SweepConfig
from sweeps.launchers.base import Launcher
from sweeps.launchers.slots import Slot
from sweeps.search.distinct_draws import grid_refusal
from sweeps.search.space import SearchSpace
from sweeps.validation.validate_optuna import check_optuna
from sweeps.validation.validate_trials import (
    check_baseline,
    check_range_types,
    check_searched_keys,
    check_trial_config,
    compose_trial,
    trial_length,
)

__all__ = [
    "SweepConfigError",
    "storage_out_of_reach",
    "trial_length",
    "validate_sweep",
]  # the driver and the CLI import these here


def _check_launcher_python(sweep: SweepConfig, launcher: Launcher) -> None:
    """A local launcher's interpreter must exist and have this project: otherwise each trial's job dies at start."""
    python = sweep.launcher.get("python")
    if python is None or not launcher.shares_filesystem:
        return  # the driver's own interpreter, or one on remote machines
    found = shutil.which(str(python))
    fix = f"give an interpreter that has this project installed, or null for the driver's own ({sys.executable})"
    if found is None:
        raise SweepConfigError(f"launcher.python={python!r}: no such executable (not a file, or not on PATH); {fix}")
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('trm') is None)"
    try:  # from another directory, as the jobs run in their trial directories
        answer = subprocess.run(
            [found, "-c", probe], check=False, cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=60
        )
        ok = answer.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        raise SweepConfigError(f"launcher.python={python!r}: it cannot import trm (the training package); {fix}")


def storage_out_of_reach(storage_url: str | None, launcher: Launcher) -> str | None:
    """Why the trials' rank 0 cannot open the study storage from the launcher's workers, if this machine can tell:
    on workers that share no filesystem with the driver (a pod's VMs) a SQLite file here is another, missing file
    there. Whether a server is reachable from them only the workers can say (the pod's preflight asks them)."""
    if launcher.shares_filesystem:
        return None
    url = resolve_url(storage_url, create_dir=False)
    if is_postgres(url):  # the other scheme storage.url accepts is a SQLite file
        return None
    return (
        f"storage.url={redact(url)!r}: a SQLite file on this machine, but {type(launcher).__name__}'s workers share "
        "no filesystem with it, and each trial's rank 0 reports to the study from one of them; use storage=postgres "
        "with an address the workers reach (docs/usage.md: PostgreSQL)"
    )


def _check_roots(sweep: SweepConfig, launcher: Launcher) -> None:
    """output_root, and the trials' run and checkpoint roots where they are paths on this machine's disk (the
    workers share it): each must be writable. Roots on the workers' own disks, or in a store, are theirs to check
    (the preflight on a pod)."""
    _check_writable("output_root", sweep.output_root)
    if not launcher.shares_filesystem:
        return
    for key in ("run_root", "checkpoint_root"):
        value = getattr(sweep.trial, key)
        if value and "://" not in str(value):
            _check_writable(f"trial.{key}", value)


def _check_writable(key: str, value: Any) -> None:
    """Trial directories are made under the root once the study is open: a root that cannot be written would
    fail the driver there, with the baseline trial used up, or fail every trial at its first checkpoint, each
    retried. Make it and a file in it now; leave nothing behind."""
    root = Path(str(value)).expanduser().resolve()
    created = [path for path in (root, *root.parents) if not path.exists()]  # deepest first
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".write-check-"):
            pass
    except OSError as err:
        raise SweepConfigError(
            f"{key}={str(value)!r}: cannot write there ({err.strerror or err}); choose a directory this user can write"
        ) from None
    finally:
        for path in created:
            with contextlib.suppress(OSError):
                path.rmdir()


def _check_near_best_eval(sweep: SweepConfig, base_overrides: list[str]) -> None:
    """The evidence pruner's near-best check measures "within one eval standard error" on pruner.eval_examples
    puzzles: a count other than the trials' eval would misjudge which audits are near the best."""
    if sweep.pruner.get("check") != "near_best":
        return
    examples = compose_trial(base_overrides, {}, "trial.overrides")["train"]["eval_examples"]
    if sweep.pruner.get("eval_examples") != examples:
        raise SweepConfigError(
            f"pruner.eval_examples={sweep.pruner.get('eval_examples')!r} with pruner.check=near_best: expected the "
            f"trials' train.eval_examples ({examples!r}); set pruner.eval_examples={examples}"
            + (" and give the trials a fixed train.eval_examples" if examples is None else "")
        )


def _check_slot_overrides(base_overrides: list[str], slots: list[Slot]) -> None:
    """A key the trials set that a slot sets too (the device count a pod's slice or a VM's chips give) must agree:
    the slot's comes last on the job's command line, so a different value of the trial's would be silently lost."""
    ours = override_values(base_overrides)
    for slot in slots:
        for key, value in override_values(list(slot.overrides)).items():
            if key in ours and ours[key] != value:
                raise SweepConfigError(
                    f"trial.overrides has {key}={ours[key]!r} but launcher.slots' slot {slot.name} trains with "
                    f"{key}={value!r} (from the launcher's machines): drop the key from trial.overrides or set {value}"
                )


def validate_sweep(sweep: SweepConfig, space: SearchSpace, base_overrides: list[str], launcher: Launcher) -> None:
    check_searched_keys(sweep, space)
    name = type(launcher).__name__
    slots = launcher.slots()  # launcher.slots parsed and checked against the launcher's machines
    _check_slot_overrides(base_overrides, slots)
    slot_chips = slots[0].chips  # None: a launcher that counts no chips (local, torchrun: world_size above)
    for values in space.representative():
        train_cfg = compose_trial([*base_overrides, *slots[0].overrides], values, f"study.space.{sweep.scale}")
        check_trial_config(train_cfg, launcher.world_size, name, launcher.shares_filesystem, slot_chips)
    check_range_types(sweep, space, base_overrides)
    check_baseline(sweep, space)  # after the types: a range of the wrong type is the error to name first
    check_optuna(sweep, trial_length(base_overrides))
    refusal = grid_refusal(space) if str(sweep.sampler.get("_target_")).endswith(".BruteForceSampler") else None
    if refusal:
        raise SweepConfigError(refusal)
    _check_near_best_eval(sweep, base_overrides)
    _check_launcher_python(sweep, launcher)
    unreachable = storage_out_of_reach(sweep.storage.url, launcher)
    if unreachable:
        raise SweepConfigError(unreachable)
    _check_roots(sweep, launcher)  # last: the only check that touches the disk
