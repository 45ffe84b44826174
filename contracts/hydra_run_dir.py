"""A Hydra callback that refuses a run directory this user cannot create, in one line, before Hydra tries.

Hydra creates `hydra.run.dir` (`hydra.sweep.dir` for `-m`) after `on_run_start` and reports a failure as a
traceback of its own internals. Registered in conf/hydra_app.yaml after the secret check
(storage/hydra_secrets.py), whose reasons for refusing in a callback, and with SystemExit(2), apply here too.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

EXIT_CODE = 2


def refuse_unwritable(config: DictConfig, key: str) -> None:
    """Exit with one `error:` line if the directory at `key` (resolved as Hydra resolves it) cannot be made."""
    value = OmegaConf.select(config, key)
    if value is None:
        return
    path = Path(str(value))  # as Hydra takes it: a `~` is not expanded there either
    try:
        path.mkdir(parents=True, exist_ok=True)  # Hydra makes it next: nothing is left that it would not leave
        why = None if os.access(path, os.W_OK | os.X_OK) else "it is not writable"
    except OSError as err:
        why = f"cannot create it ({err.strerror or err})"
    if why is not None:
        print(
            f"error: {key}={str(value)!r}: {why}; choose a directory this user can write", file=sys.stderr, flush=True
        )
        raise SystemExit(EXIT_CODE)


class CheckRunDir(Callback):
    """`hydra.callbacks` entry: the run (or sweep) directory can be made, before Hydra makes it."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        refuse_unwritable(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        refuse_unwritable(config, "hydra.sweep.dir")
