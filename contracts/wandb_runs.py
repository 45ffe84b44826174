"""A W&B run's identity and mode, shared by a trial's job (trm/tracking/tracker.py) and the driver's study-summary run
(sweeps/trials/wandb_summary.py), so both sides name the same run the same way.

W&B never touches the network unless asked to: `wandb.mode=auto` is `online` only where W&B would find an API key
(`WANDB_API_KEY`, or the ~/.netrc entry `wandb login` writes) and `WANDB_MODE` does not say offline/disabled, else
`offline` (upload later with `wandb sync <run dir>`)."""

from __future__ import annotations

import configparser
import contextlib
import functools
import netrc
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, cast
from urllib.parse import urlsplit

from contracts.hydra_app import packaged_yaml

MODES = ("auto", "offline", "online", "disabled")
Mode = Literal["offline", "online", "disabled"]  # what `auto` resolves to, and what wandb.init takes


@functools.cache
def default_project() -> str:
    """The W&B project of a run whose config names none (`wandb.project=null`): conf/wandb/default.yaml's, the
    one both apps compose, read from the config package rather than repeated here."""
    return str(packaged_yaml("wandb/default.yaml")["project"])


DEFAULT_HOST = "https://api.wandb.ai"  # W&B's server when neither WANDB_BASE_URL nor its settings name one


def wandb_host(environ: Mapping[str, str] = os.environ) -> str:
    """The W&B server a run talks to: `WANDB_BASE_URL`, else the `base_url` of W&B's global settings file
    (`$WANDB_CONFIG_DIR/settings`, else ~/.config/wandb/settings: where `wandb login --host` puts it), else
    W&B's own. A workspace's ./wandb/settings is not read: a trial's job runs in a fresh directory."""
    if environ.get("WANDB_BASE_URL"):
        return str(environ["WANDB_BASE_URL"])
    config_dir = environ.get("WANDB_CONFIG_DIR") or (
        str(Path(environ["HOME"]) / ".config" / "wandb") if environ.get("HOME") else None
    )
    if config_dir:
        settings = configparser.ConfigParser()
        with contextlib.suppress(OSError, configparser.Error):
            settings.read(Path(config_dir).expanduser() / "settings")
        if settings.get("default", "base_url", fallback=None):
            return settings.get("default", "base_url")
    return DEFAULT_HOST


def api_key_found(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether W&B would find an API key: `WANDB_API_KEY`, else the netrc entry of its server (wandb_host; the file
    `$NETRC`, else ~/.netrc), where `wandb login` keeps it. Read here rather than through wandb, whose key lookup
    is internal and has moved between releases; tests/test_tracking.py checks this against wandb's own reader."""
    if environ.get("WANDB_API_KEY"):
        return True
    home = environ.get("HOME")
    path = environ.get("NETRC") or (str(Path(home) / ".netrc") if home else None)
    host = urlsplit(wandb_host(environ)).netloc
    if not path or not host:
        return False
    try:
        entry = netrc.netrc(os.path.expanduser(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


def resolve_mode(mode: str | None, environ: Mapping[str, str] = os.environ) -> Mode:
    """`auto`: online only where W&B finds an API key (api_key_found) and WANDB_MODE does not say offline or
    disabled, else offline."""
    mode = (mode or "auto").lower()
    if mode not in MODES:
        raise ValueError(f"wandb.mode={mode!r}: expected one of {list(MODES)}")
    if mode != "auto":
        return cast(Mode, mode)  # one of MODES other than auto: checked above
    env_mode = (environ.get("WANDB_MODE") or "").lower()
    if env_mode in ("offline", "dryrun"):
        return "offline"
    if env_mode == "disabled":
        return "disabled"
    return "online" if api_key_found(environ) else "offline"


Console = Literal["auto", "off", "wrap", "redirect", "wrap_raw", "wrap_emu"]  # wandb.Settings(console=...)


def run_settings(
    *, init_timeout_s: float, finish_timeout_s: float, console: str = "off", system_metrics: bool = False
) -> Any:
    """The wandb.Settings of every run here: quiet, and bounded at both ends (init_timeout_s, finish_timeout_s of
    conf/wandb/default.yaml). W&B's own finish waits for its upload for ever: with the network gone mid-run the
    job, and the slot it holds, or the driver would wait with it; past the limit the rest stays on disk, for
    `wandb sync`. A console value W&B does not take raises here (the caller leaves the run untracked)."""
    import wandb

    return wandb.Settings(
        silent=True,
        console=cast(Console, console),
        x_disable_stats=not system_metrics,
        init_timeout=float(init_timeout_s),
        finish_timeout=float(finish_timeout_s),
    )


def trial_run_id(study_uid: str, origin: int, seed_index: int = 0) -> str:
    """The W&B run id of a sweep trial's job: `<study uid[:12]>-t<origin>-s<seed index>`.

    One id per retry chain (`origin`: its first trial, whose checkpoints every retry resumes) and seed, so a
    retry continues its chain's run; the study's random uid keeps a new study under an old name from resuming
    an old study's runs (W&B ids are unique per project, and a deleted run's id cannot be used again)."""
    return f"{str(study_uid)[:12]}-t{int(origin)}-s{int(seed_index)}"


def summary_run_id(study_uid: str) -> str:
    """The W&B run id of a study's `study-summary` run: every driver start of the study updates that one run."""
    return f"{str(study_uid)[:12]}-summary"


def finish_run(run: Any, exit_code: int = 0) -> None:
    """Finish `run` and, when no other W&B run is active in this process, stop the W&B service.

    In offline mode `run.finish()` can return before the service has written the end of the run log; the
    atexit hook flushes it when the process ends, but a run read back (or synced) right away needs the
    teardown."""
    import wandb

    run.finish(exit_code=exit_code)
    # Runs made with reinit="create_new" never become `wandb.run`: W&B's setup knows which are still active.
    if wandb.setup().most_recent_active_run is None:
        try:
            wandb.teardown()
        except SystemExit as stop:  # W&B ends the process when its service exited badly: a run never does
            raise RuntimeError(f"the W&B service ended with status {stop.code}") from None
