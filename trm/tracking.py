"""Experiment tracking on rank 0 (W&B): one run per training job. Other ranks never create a run.

A sweep trial's run is named `<study>-<trial number>` in group `<study>` (job type `trial`); a plain training
run is `manual-<out_dir name>` in group `manual` (job type `train`). `wandb.run_id` (the driver passes
`trial_run_id`: one per study, retry chain and seed) opens the run with that id and `resume="allow"`, so a job
resumed from its checkpoint (a retry resumes its chain's first attempt's) continues the run it started instead of
adding one; without it W&B draws a random id. The run's config is the resolved training
config (storage URL redacted, values read from environment variables replaced by `<env:NAME>`; `train.precision`
the mode the job resolved, `train.precision_reason` why: trm/precision.py), the trial's
sampled parameters as `trial_params`, and the model size; tags name the study, sampler, pruner and launcher
(read from the study record) plus `wandb.tags`. Metrics are logged against the training step at the loop's
log/eval points only; the summary holds the outcome, objective, best value and step, parameter count and
compute.

W&B never touches the network unless asked to: `wandb.mode=auto` is `online` only when `WANDB_API_KEY` is set
(and `WANDB_MODE` does not say offline/disabled), else `offline` (upload later with `wandb sync <run dir>`).
The run directory is `<out_dir>/wandb/` unless `wandb.dir` says otherwise. Tracking is never worth a training
run: if wandb cannot be imported or a call fails, one warning is printed and the job continues untracked.

Everything a W&B run of this project is (ids, names, tags, config, summary) is decided here, next to the tracker
that opens it; sweeps/wandb_summary.py reuses the ids and modes.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict, cast

import yaml
from omegaconf import DictConfig, OmegaConf

from trm.config import packaged_yaml, to_dict

if TYPE_CHECKING:  # a type only: trm.precision imports torch, which this module does not need
    from trm.precision import Precision

MODES = ("auto", "offline", "online", "disabled")
Mode = Literal["offline", "online", "disabled"]  # what `auto` resolves to, and what wandb.init takes
Console = Literal["auto", "off", "wrap", "redirect", "wrap_raw", "wrap_emu"]  # wandb.Settings(console=...)
MANUAL_GROUP = "manual"
# Keys of the training summary (trm.train) that go into the W&B run summary.
SUMMARY_KEYS = (
    "outcome",
    "objective",
    "best_value",
    "best_step",
    "steps",
    "params",
    "puzzle_emb_params",
    "flops_per_sample_step",
    "compute_flops",
    "seconds",
)
_ENV_INTERPOLATION = re.compile(r"\$\{oc\.env:\s*([^,}\s]+)")
_warned = False


def warn(message: str) -> None:
    """One warning per process: tracking problems must not drown the training log."""
    global _warned  # noqa: PLW0603 (one flag per process is the contract)
    if not _warned:
        _warned = True
        print(f"warning: W&B tracking is off for this run: {message}", file=sys.stderr, flush=True)


class Tracker:
    """No-op tracker: the interface the training loop calls (non-zero ranks, tracking disabled or broken)."""

    run: Any = None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def close(self, summary: dict[str, Any]) -> None:
        pass


class WandbTracker(Tracker):
    """Rank 0's W&B run. Every call is guarded: a tracking error turns the tracker into a no-op."""

    def __init__(self, run: Any):
        self.run = run
        self.finished = False

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.run is None:
            return
        try:
            self.run.log({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}, step=int(step))
        except Exception as err:  # noqa: BLE001 - tracking never stops training
            self._give_up(err)

    def close(self, summary: dict[str, Any]) -> None:
        if self.run is None or self.finished:
            return
        self.finished = True
        try:
            self.run.summary.update(run_summary(summary))
            if summary.get("outcome") == "PREEMPTED":  # stopped by SIGTERM with a checkpoint; a retry resumes
                self.run.mark_preempting()
            finish_run(self.run, exit_code=1 if summary.get("outcome") == "FAIL" else 0)
        except Exception as err:  # noqa: BLE001
            self._give_up(err)
        self.run = None

    def _give_up(self, err: BaseException) -> None:
        warn(f"{type(err).__name__}: {err}")
        run, self.run = self.run, None
        with contextlib.suppress(Exception):
            run.finish(exit_code=1)


def finish_run(run: Any, exit_code: int = 0) -> None:
    """Finish `run` and, when no other W&B run is active in this process, stop the W&B service.

    In offline mode `run.finish()` can return before the service has written the end of the run log; the
    atexit hook flushes it when the process ends, but a run read back (or synced) right away needs the
    teardown."""
    import wandb

    run.finish(exit_code=exit_code)
    if wandb.run is None:
        wandb.teardown()


# ------------------------------------------------------------------------------------------- settings


@functools.cache
def default_project() -> str:
    """The W&B project of a run whose config names none (`wandb.project=null`): conf/wandb/default.yaml's, the
    one both apps compose, read from the config package rather than repeated here."""
    return str(packaged_yaml("wandb/default.yaml")["project"])


def resolve_mode(mode: str | None, environ: Mapping[str, str] = os.environ) -> Mode:
    """`auto`: online only with an API key in the environment (and no WANDB_MODE=offline/disabled), else offline."""
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
    return "online" if environ.get("WANDB_API_KEY") else "offline"


def trial_run_id(study_uid: str, origin: int, seed_index: int = 0) -> str:
    """The W&B run id of a sweep trial's job: `<study uid[:12]>-t<origin>-s<seed index>`.

    One id per retry chain (`origin`: its first trial, whose checkpoints every retry resumes) and seed, so a
    retry continues its chain's run; the study's random uid keeps a new study under an old name from resuming
    an old study's runs (W&B ids are unique per project, and a deleted run's id cannot be used again)."""
    return f"{str(study_uid)[:12]}-t{int(origin)}-s{int(seed_index)}"


def summary_run_id(study_uid: str) -> str:
    """The W&B run id of a study's `study-summary` run: every driver start of the study updates that one run."""
    return f"{str(study_uid)[:12]}-summary"


class RunIdentity(TypedDict):
    group: str
    name: str
    job_type: str


def run_identity(cfg: DictConfig) -> RunIdentity:
    """W&B group, name and job type of this job's run."""
    sweep = cfg.get("sweep") or {}
    study = sweep.get("study")
    if study is None:
        out_name = Path(str(cfg.get("out_dir") or "run")).name or "run"
        return {"group": MANUAL_GROUP, "name": f"{MANUAL_GROUP}-{out_name}", "job_type": "train"}
    name = f"{study}-{sweep.get('trial_number')}"
    seed_index = int(sweep.get("seed_index") or 0)
    if seed_index:
        name += f"-seed{seed_index}"
    return {"group": str(study), "name": name, "job_type": "trial"}


def _mask_env(node: Any) -> Any:
    """Replace every `${oc.env:NAME...}` value by `<env:NAME>` (before resolving), so no env value is logged."""
    if isinstance(node, dict):
        return {k: _mask_env(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_mask_env(v) for v in node]
    if isinstance(node, str):
        match = _ENV_INTERPOLATION.search(node)
        if match:
            return f"<env:{match.group(1)}>"
    return node


def safe_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved training config without secrets: env values masked, storage URL redacted."""
    masked = OmegaConf.create(_mask_env(to_dict(cfg, resolve=False)))
    resolved: dict[str, Any]
    try:
        resolved = to_dict(masked)
    except Exception:  # noqa: BLE001 - e.g. ${hydra:...} outside a Hydra app: resolve key by key
        resolved = {str(key): _resolve_key(masked, str(key)) for key in masked}
    resolved.pop("wandb", None)  # the tracker's own settings are not a property of the trial
    sweep = resolved.get("sweep")
    if isinstance(sweep, dict) and sweep.get("storage"):
        from storage import redact

        sweep["storage"] = redact(str(sweep["storage"]))
    return resolved


def _resolve_key(cfg: DictConfig, key: str) -> Any:
    """One top-level key resolved; what does not resolve is kept as written (an interpolation string)."""
    try:
        node = cfg[key]
        return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    except Exception:  # noqa: BLE001
        node = cfg._get_node(key)
        if node is None:  # not a key of cfg (the caller iterates cfg's own keys)
            raise KeyError(key) from None
        return OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else str(node._value())


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """`["arch.hidden_size=64", "optim=lion"]` -> `{"arch.hidden_size": 64, "optim": "lion"}` (YAML values)."""
    params: dict[str, Any] = {}
    for item in overrides:
        key, sep, value = str(item).partition("=")
        if not sep:
            continue
        try:
            params[key.lstrip("+~")] = yaml.safe_load(value)
        except yaml.YAMLError:
            params[key.lstrip("+~")] = value
    return params


def trial_record(cfg: DictConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the trial's sampled parameters, the study's user attributes), read from the study storage.

    The driver stores the trial's training overrides as the trial user attribute `overrides`, and the
    sampler, pruner and launcher as study attributes; a job needs only its sweep.* keys to find them."""
    from storage import close_storage, engine_settings, open_storage

    sweep = cfg.sweep
    # The driver created the schema: no table creation or version check here (~1 s of every trial's start).
    storage = open_storage(
        str(sweep.storage),
        password_env=sweep.get("password_env"),
        create_schema=False,
        **engine_settings(sweep.get("storage_engine"), "sweep.storage_engine"),
    )
    try:
        study_id = storage.get_study_id_from_name(str(sweep.study))
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, int(sweep.trial_number))
        trial = storage.get_trial(trial_id)
        overrides = trial.user_attrs.get("overrides")
        if overrides:
            params = parse_overrides(overrides)
        else:  # a trial not started by our driver: Optuna's names (`key@choice` for conditionals)
            params = {name.split("@", 1)[0]: value for name, value in trial.params.items()}
        return params, dict(storage.get_study_user_attrs(study_id))
    finally:
        close_storage(storage)


def _short(spec: Any) -> str | None:
    """`{"_target_": "optuna.pruners.HyperbandPruner", ...}` or "TPESampler" -> the class name."""
    if isinstance(spec, dict):
        spec = spec.get("_target_")
    return str(spec).rsplit(".", 1)[-1] if spec else None


def run_tags(cfg: DictConfig, study_attrs: dict[str, Any]) -> list[str]:
    tags: list[str] = []
    study = (cfg.get("sweep") or {}).get("study")
    if study is not None:
        tags.append(f"study:{study}")
    for key in ("sampler", "pruner", "launcher"):
        name = _short(study_attrs.get(key))
        if name:
            tags.append(f"{key}:{name}")
    tags += [str(t) for t in ((cfg.get("wandb") or {}).get("tags") or [])]
    return list(dict.fromkeys(t[:64] for t in tags))  # W&B limits tags to 64 characters


def run_summary(summary: dict[str, Any]) -> dict[str, Any]:
    out = {k: summary.get(k) for k in SUMMARY_KEYS if k in summary}
    if summary.get("error"):
        out["error"] = str(summary["error"])[-1000:]
    for key, value in (summary.get("final") or {}).items():
        out[f"final/{key}"] = value
    for key, value in (summary.get("throughput") or {}).items():  # step speed, comparable across runs in W&B
        out[f"throughput/{key}"] = value
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}


# --------------------------------------------------------------------------------------------- factory


def make_tracker(
    cfg: DictConfig, is_main: bool, extra: dict[str, Any] | None = None, precision: Precision | None = None
) -> Tracker:
    """The tracker for this process: a W&B run on rank 0 when enabled in config, else a no-op. `precision`: what
    `train.precision` resolved to (the run's config shows that mode, not `auto`, and the reason beside it)."""
    if not is_main:
        return Tracker()  # other ranks never import wandb, let alone create a run
    wcfg = cfg.get("wandb")
    if wcfg is None or not wcfg.get("enabled", True):
        return Tracker()
    try:
        mode = resolve_mode(wcfg.get("mode"))
    except ValueError as err:
        warn(str(err))
        return Tracker()
    if mode == "disabled":
        return Tracker()
    sweep = cfg.get("sweep") or {}
    params: dict[str, Any] = {}
    study_attrs: dict[str, Any] = {}
    if sweep.get("study") is not None and sweep.get("storage"):
        try:
            params, study_attrs = trial_record(cfg)
        except Exception as err:  # noqa: BLE001 - the run is still worth having without them
            print(
                f"warning: W&B run without trial parameters (cannot read the trial: {type(err).__name__}: {err})",
                file=sys.stderr,
                flush=True,
            )
    try:
        import wandb

        run_dir = Path(str(wcfg.get("dir") or cfg.out_dir)).resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        config = safe_config(cfg)
        if precision is not None and isinstance(config.get("train"), dict):
            config["train"].update(precision=precision.mode, precision_reason=precision.reason)
        config["trial_params"] = params
        config["model"] = dict(extra or {})
        settings = wandb.Settings(
            silent=True,
            console=cast(Console, str(wcfg.get("console") or "off")),  # a bad value: Settings raises, untracked
            x_disable_stats=not wcfg.get("system_metrics", False),
            init_timeout=float(wcfg.get("init_timeout_s") or 60),
        )
        run_id = wcfg.get("run_id")
        run = wandb.init(
            project=str(wcfg.get("project") or default_project()),
            entity=wcfg.get("entity"),
            id=str(run_id) if run_id else None,
            resume="allow" if run_id else None,  # the same id continues that run (offline: docs/usage.md, W&B)
            dir=str(run_dir),
            mode=mode,
            config=config,
            tags=run_tags(cfg, study_attrs),
            settings=settings,
            reinit="create_new",
            **run_identity(cfg),
        )
    except Exception as err:  # noqa: BLE001 - ImportError, bad settings, a stuck service: train untracked
        warn(f"{type(err).__name__}: {err}")
        return Tracker()
    return WandbTracker(run)
