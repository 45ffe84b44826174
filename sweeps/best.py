"""`python -m sweeps.best study=NAME [trial=N] [format=text|json] [storage.url=...]`: reuse what a study found.

Prints the best trial (or trial N) as things a user can paste: its parameters as `trm.train` overrides (plain
keys: a conditional `optim.lr@adamw` becomes `optim.lr`), the whole command that re-trains it (append
`train.steps=...` or `seed=...` to train longer or with another seed: the last override wins), its best
checkpoint, its W&B run and the code version that produced it. Needs nothing but the storage.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from storage.cli import STORAGE_KEYS, ArgumentError, parse_args, run_cli, study_from_args
from storage.record import (
    BEST_CHECKPOINT_NOTE_ATTR,
    CHECKPOINT_URL_ATTR,
    CODE_VERSION_ATTR,
    TRAIN_OVERRIDES_ATTR,
    trial_detail,
)
from sweeps.space import params_to_values, to_overrides

USAGE = __doc__.split("\n\n")[0].strip() + "\n\n" + __doc__.split("\n\n", 1)[1].strip()
KNOWN: dict[str, str | None] = {"study": None, "trial": None, "format": "text", **STORAGE_KEYS}
FORMATS = ("text", "json")


def pick(study: optuna.Study, number: str | None) -> FrozenTrial:
    """Trial `number`, or the study's best (single objective)."""
    if number is not None:
        try:
            return study.get_trials(deepcopy=False)[int(number)]
        except (ValueError, IndexError):
            raise ArgumentError(f"trial={number!r}: the study has trials 0..{len(study.trials) - 1}") from None
    if len(study.directions) > 1:
        raise ArgumentError(
            f"study {study.study_name!r} has {len(study.directions)} objectives: name one Pareto trial with trial=N"
        )
    if not any(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False)):
        raise ArgumentError(f"study {study.study_name!r} has no completed trial yet")
    return study.best_trial


def describe(study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
    """What a user needs to reuse `trial`, as plain values."""
    attrs = trial.user_attrs
    values = params_to_values(trial.params)
    overrides = to_overrides(values)
    train_overrides = trial_detail(attrs, TRAIN_OVERRIDES_ATTR) or overrides  # the whole set the job trained with
    checkpoint_url = attrs.get(CHECKPOINT_URL_ATTR)
    return {
        "study": study.study_name,
        "trial": trial.number,
        "state": trial.state.name,
        "value": trial.values if trial.values and len(trial.values) > 1 else trial.value,
        "objective": study.user_attrs.get("objective"),
        "best_step": attrs.get("best_step"),
        "overrides": overrides,
        "retrain": ["python", "-m", "trm.train", *train_overrides],
        "best_checkpoint": f"{checkpoint_url.rstrip('/')}/best.pt" if checkpoint_url else None,
        "best_checkpoint_note": attrs.get(BEST_CHECKPOINT_NOTE_ATTR),  # set when best.pt is not the best
        "wandb": {"group": study.study_name, "name": f"{study.study_name}-{trial.number}"},
        "workdir": attrs.get("workdir"),
        "code_version": attrs.get(CODE_VERSION_ATTR),
    }


def render_text(info: dict[str, Any]) -> str:
    value = info["value"]
    shown = (
        "none"
        if value is None
        else (", ".join(f"{v:.4f}" for v in value) if isinstance(value, list) else f"{value:.4f}")
    )
    lines = [
        f"study {info['study']}, trial {info['trial']} ({info['state']}): {info['objective']} = {shown}"
        + (f" at step {info['best_step']}" if info["best_step"] is not None else ""),
        f"overrides:  {shlex.join(info['overrides'])}",
        f"retrain:    {shlex.join(info['retrain'])}",
        f"checkpoint: {info['best_checkpoint'] or 'not recorded'}"
        + (f"\n  warning:  {info['best_checkpoint_note']}" if info["best_checkpoint_note"] else ""),
        f"wandb:      group={info['wandb']['group']} name={info['wandb']['name']}",
        f"workdir:    {info['workdir'] or 'not recorded'}",
        f"code:       {info['code_version'] or 'not recorded'}",
    ]
    return "\n".join(lines)


def main_body(argv: list[str]) -> int:
    args = parse_args(argv, KNOWN, USAGE)
    if args["format"] not in FORMATS:
        raise ArgumentError(f"format={args['format']!r}: expected one of {list(FORMATS)}")
    study = study_from_args(args)
    info = describe(study, pick(study, args.get("trial")))
    print(json.dumps(info) if args["format"] == "json" else render_text(info))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(main_body, argv)


if __name__ == "__main__":
    raise SystemExit(main())
