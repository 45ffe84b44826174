"""What a trial's W&B run is: its group, name and job type, its config (secrets masked), the trial's sampled
parameters and the study's settings as tags, and its summary.

A sweep trial's run is named `<study>-<trial number>` in group `<study>` (job type `trial`); a plain training
run is `manual-<out_dir name>` in group `manual` (job type `train`). The run's config is the resolved training
config (storage URL redacted, values read from environment variables replaced by `<env:NAME>`; `train.precision`
the mode the job resolved, `train.precision_reason` why: trm/precision.py), the trial's sampled parameters as
`trial_params` (from the job's own command line: `sweep.sampled` names them), and the model size; tags name the
study, sampler, pruner and launcher (read from the study record) plus `wandb.tags`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict

from omegaconf import OmegaConf

from contracts.hydra_app import TrainJob, to_dict
from contracts.overrides import override_values
from contracts.run_summary import RunSummary
from contracts.train_config import SweepLink, TrainApp
from storage.study_record import StudyAttrs

MANUAL_GROUP = "manual"
_ENV_INTERPOLATION = re.compile(r"\$\{oc\.env:\s*([^,}\s]+)")


class RunIdentity(TypedDict):
    group: str
    name: str
    job_type: str


def run_identity(cfg: TrainApp) -> RunIdentity:
    """W&B group, name and job type of this job's run."""
    study = cfg.sweep.study
    if study is None:
        out_name = Path(cfg.out_dir or "run").name or "run"
        return {"group": MANUAL_GROUP, "name": f"{MANUAL_GROUP}-{out_name}", "job_type": "train"}
    name = f"{study}-{cfg.sweep.trial_number}"
    if cfg.sweep.confirm:  # the trial's configuration on a fresh seed (trm/links/confirm.py)
        return {"group": study, "name": f"{name}-confirm-seed{cfg.seed}", "job_type": "confirm"}
    if cfg.sweep.seed_index:
        name += f"-seed{cfg.sweep.seed_index}"
    return {"group": study, "name": name, "job_type": "trial"}


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


def safe_config(written: Mapping[str, Any]) -> dict[str, Any]:
    """The training config as written (contracts.hydra_app.TrainJob), resolved without secrets: env values masked
    before resolving, storage URL redacted."""
    masked = OmegaConf.create(_mask_env(dict(written)))  # OmegaConf only as the interpolation engine

    def resolve_key(key: str) -> Any:
        """One top-level key resolved; what does not resolve is kept as written (an interpolation string)."""
        try:
            node = masked[key]
            return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
        except Exception:  # noqa: BLE001 - any resolver error: the key is kept as written
            node = masked._get_node(key)
            if node is None:  # not a key of masked (the caller iterates its own keys)
                raise KeyError(key) from None
            return OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else str(node._value())

    resolved: dict[str, Any]
    try:
        resolved = to_dict(masked)
    except Exception:  # noqa: BLE001 - e.g. ${hydra:...} outside a Hydra app: resolve key by key
        resolved = {str(key): resolve_key(str(key)) for key in masked}
    resolved.pop("wandb", None)  # the tracker's own settings are not a property of the trial
    sweep = resolved.get("sweep")
    if isinstance(sweep, dict) and sweep.get("storage"):
        from storage import redact

        sweep["storage"] = redact(str(sweep["storage"]))
    return resolved


def sampled_params(job: TrainJob) -> dict[str, Any]:
    """The trial's sampled parameters, as the job read them: the values its own command line gives the keys the
    study sampled (`sweep.sampled`, passed by the driver); {} for a plain run."""
    given = override_values(list(job.overrides))
    keys = [str(key).lstrip("+") for key in job.app.sweep.sampled or []]
    return {key: given[key] for key in keys if key in given}


def study_attributes(sweep: SweepLink) -> dict[str, Any]:
    """The study's user attributes (its sampler, pruner and launcher, for the run's tags), read from the study
    storage; a job needs only its sweep.* keys to find them."""
    from storage import close_storage, engine_settings, open_storage

    if sweep.study is None:  # link_from_config refused the job already
        raise ValueError(f"sweep.study={sweep.study!r}: not a trial")
    # The driver created the schema: no table creation or version check here (storage.open_storage).
    storage = open_storage(
        str(sweep.storage),
        password_env=sweep.password_env,
        create_schema=False,
        **engine_settings(sweep.storage_engine, "sweep.storage_engine"),
    )
    try:
        return dict(storage.get_study_user_attrs(storage.get_study_id_from_name(sweep.study)))
    finally:
        close_storage(storage)


def _short(spec: Any) -> str | None:
    """`{"_target_": "optuna.pruners.HyperbandPruner", ...}` or "TPESampler" -> the class name."""
    if isinstance(spec, dict):
        spec = spec.get("_target_")
    return str(spec).rsplit(".", 1)[-1] if spec else None


def run_tags(cfg: TrainApp, study_attrs: dict[str, Any]) -> list[str]:
    """The run's tags: the study's, its sampler's, pruner's and launcher's, and `wandb.tags`."""
    tags: list[str] = []
    study = cfg.sweep.study
    if study is not None:
        tags.append(f"study:{study}")
    attrs = StudyAttrs.of(study_attrs)
    for key, spec in (("sampler", attrs.sampler), ("pruner", attrs.pruner), ("launcher", attrs.launcher)):
        name = _short(spec)
        if name:
            tags.append(f"{key}:{name}")
    tags += [str(t) for t in (cfg.wandb.get("tags") or [])]
    return list(dict.fromkeys(t[:64] for t in tags))  # W&B limits tags to 64 characters


def run_summary(summary: RunSummary) -> dict[str, Any]:
    """The W&B run's summary: the run's headline facts, its error's tail, every final metric and its step speed
    (non-finite numbers as None: W&B refuses them)."""
    s = summary
    out: dict[str, Any] = {
        "outcome": s.outcome,
        "objective": s.objective,
        "best_value": s.best_value,
        "best_step": s.best_step,
        "steps": s.steps,
        "params": s.params,
        "puzzle_emb_params": s.puzzle_emb_params,
        "flops_per_sample_step": s.flops_per_sample_step,
        "compute_flops": s.compute_flops,
        "seconds": s.seconds,
    }
    if s.error:
        out["error"] = str(s.error)[-1000:]
    for key, value in (s.final or {}).items():
        out[f"final/{key}"] = value
    for key, value in (s.throughput or {}).items():  # step speed, comparable across runs in W&B
        out[f"throughput/{key}"] = value
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}
