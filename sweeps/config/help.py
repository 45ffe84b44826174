"""`python -m sweeps.run --help`: the sweep's own config groups and their options, read from the config package.

Hydra's generated help lists every group on the search path, the training groups (`arch`, `optim`, ...) too,
which the sweep refuses at the top level: a trial's training keys go in `trial.overrides`."""

from __future__ import annotations

from contracts.hydra_app import group_options

SWEEP_GROUPS = ("study", "site", "storage", "storage/engine", "launcher", "sampler", "pruner", "wandb")


def sweep_group_lines() -> list[str]:
    """The sweep's config groups with their options, a heading first (sweeps.run's and sweeps.preflight's --help)."""
    return [
        "Config groups of the sweep (group=option):",
        *(f"  {group}: {', '.join(group_options(group))}" for group in SWEEP_GROUPS),
    ]


def help_text() -> str:
    lines = [
        "python -m sweeps.run study=NAME [group=option ...] [key=value ...]",
        "",
        *sweep_group_lines(),
        "",
        "Every trial's training keys go in trial.overrides, each element quoted:",
        '  \'trial.overrides=["experiment=tiny_cpu","train.steps=60"]\'   (python -m trm.train --help lists them)',
        "The composed config: python -m sweeps.run [overrides] --cfg job. Hydra's own flags: --hydra-help.",
    ]
    return "\n".join(lines)
