"""`python -m sweeps.run --help`: the sweep's own config groups and their options, read from the config package.

Hydra's generated help lists every group on the search path, the training groups (`arch`, `optim`, ...) too,
which the sweep refuses at the top level: a trial's training keys go in `trial.overrides`."""

from __future__ import annotations

from importlib import resources

from contracts.hydra_app import CONFIG_MODULE

SWEEP_GROUPS = ("study", "site", "storage", "storage/engine", "launcher", "sampler", "pruner", "wandb")


def group_options(group: str) -> list[str]:
    """The options of a config group: its YAML files, less the `_`-prefixed bases other options extend."""
    folder = resources.files(CONFIG_MODULE).joinpath(group)
    names = (entry.name for entry in folder.iterdir() if entry.is_file())
    return sorted(name.removesuffix(".yaml") for name in names if name.endswith(".yaml") and not name.startswith("_"))


def help_text() -> str:
    lines = [
        "python -m sweeps.run study=NAME [group=option ...] [key=value ...]",
        "",
        "Config groups of the sweep (group=option):",
        *(f"  {group}: {', '.join(group_options(group))}" for group in SWEEP_GROUPS),
        "",
        "Every trial's training keys go in trial.overrides, each element quoted:",
        '  \'trial.overrides=["experiment=tiny_cpu","train.steps=60"]\'   (python -m trm.train --help lists them)',
        "The composed config: python -m sweeps.run [overrides] --cfg job. Hydra's own flags: --hydra-help.",
    ]
    return "\n".join(lines)
