"""A Hydra callback that refuses a run whose config or command line holds a secret, before Hydra writes it.

Registered in conf/hydra_app.yaml (``hydra.callbacks.refuse_secrets``), which both apps use, so it guards
``python -m sweeps.run``, ``python -m trm.train`` and every trial job the driver launches (they are
``trm.train`` runs too). What counts as a secret is decided by :mod:`storage.secrets`.

Why refuse here, and not redact or refuse later (checked against Hydra 1.4.0rc3):

* ``hydra/_internal/hydra.py`` calls ``on_run_start`` (``on_multirun_start`` for ``-m``) right after
  composing the config and *before* ``hydra/core/utils.py:_run_job``, which creates the run directory,
  opens the job log file (``<app>.log``) and writes ``.hydra/config.yaml``, ``hydra.yaml`` and
  ``overrides.yaml``, all before ``on_job_start`` and the app's own code. A check in the app is
  therefore too late: the secret is already on disk.
* A redacted copy would keep the files but not the run: the secret would still sit on the process's
  command line (visible in ``ps``), be handed on to trial jobs, W&B and the study, and Hydra's files
  would no longer re-run the job. Every secret has a proper channel (``storage.password_env`` /
  ``~/.pgpass`` for the database, ``WANDB_API_KEY``, the storage client's credentials), so a one-line
  refusal naming it is both safer and clearer. ``hydra.output_subdir=null`` was not enough either: it
  stops ``.hydra/`` but not the log file, and loses the files for every good run too.
* Hydra catches and merely warns about an ``Exception`` raised by a callback, so the refusal is a
  ``SystemExit(2)`` (the exit code the apps already use for config errors).
"""

from __future__ import annotations

import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from storage.secrets import find_secret

EXIT_CODE = 2


def refuse_if_secret(config: DictConfig) -> None:
    """Exit with one ``error:`` line on stderr if ``config`` (as Hydra would save it) holds a secret."""
    try:
        container = OmegaConf.to_container(config, resolve=False)
        # The app's own keys first, so a refusal names `storage.url`, not `hydra.overrides.task`.
        items = sorted(dict(container).items(), key=lambda kv: kv[0] == "hydra")  # type: ignore[arg-type]
        refusal = find_secret({str(k): v for k, v in items})
    except Exception as err:  # noqa: BLE001 - fail closed: an unchecked config is not written either
        refusal = f"could not check the config for secrets ({type(err).__name__}); nothing was run or written"
    if refusal is not None:
        print(f"error: {refusal}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CODE)


class RefuseSecrets(Callback):
    """``hydra.callbacks`` entry: the check runs before Hydra creates the run (or sweep) directory."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        refuse_if_secret(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        refuse_if_secret(config)
