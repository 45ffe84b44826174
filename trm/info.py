"""`python -m trm.info arch=<preset> [key=value ...]`: one JSON line describing a model config.
`python -m trm.info --batch`: the same for each JSON list of overrides read from stdin, one per line
(contracts/model_info.py: the lines, typed).

FLOPs come from trm/flops.py (torch's FlopCounterMode on one supervision step for one sample).
"""

from __future__ import annotations

import sys
from typing import Any, cast

from omegaconf import OmegaConf

from contracts.hydra_app import compose_train_config, run_app, to_dict, train_group_lines
from contracts.model_info import BATCH_FLAG, ModelInfo, read_request
from contracts.train_config import TrainLoop
from trm.flops import flops_per_sample_step
from trm.model import ACTModel, TRMConfig, count_params


def arch_config(arch: dict[str, Any]) -> TRMConfig:
    """The `arch` block as the model's config, with the Sudoku dataset's sizes (TRMConfig's defaults)."""
    return TRMConfig.from_dict(arch)


def describe(arch_block: dict[str, Any], train: TrainLoop) -> ModelInfo:
    """Size, FLOPs and run length of the model `arch_block` describes, trained as `train` says."""
    arch = arch_config(arch_block)
    counts = count_params(ACTModel(arch))
    return ModelInfo(
        arch=arch_block,
        params=counts["params"],
        puzzle_emb_params=counts["puzzle_emb_params"],
        flops_per_sample_step=flops_per_sample_step(arch),
        seq_len=arch.total_len,
        global_batch_size=train.global_batch_size,
        train_steps=train.steps,
        halt_max_steps=arch.halt_max_steps,
    )


def info_line(overrides: list[str]) -> str:
    """The ModelInfo line of the training config `overrides` compose. Only the two blocks it reads are typed: the
    rest (`out_dir`: Hydra's run directory; a data path still `???`) says nothing about the model."""
    cfg = compose_train_config(overrides)
    return describe(to_dict(cfg.arch), cast(TrainLoop, OmegaConf.to_object(cfg.train))).line()


def help_text() -> str:
    """`--help`: this module's usage and the training config's groups (the overrides it accepts are trm.train's)."""
    lines = ["Config groups of the trainer (group=option):", *train_group_lines()]
    return "\n".join(
        [(__doc__ or "").strip(), "", *lines, "", "Any other key of `python -m trm.train --help`'s config: key=value."]
    )


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if {"-h", "--help"} & set(args):  # before composing: Hydra's override grammar refuses `--help` with a traceback
        run_app(lambda: print(help_text()))  # `--help | head` ends quietly
        return
    if args == [BATCH_FLAG]:  # one request per stdin line, one ModelInfo line out for each
        for line in sys.stdin:  # (the sweep's dry run prices every trial with one interpreter and one torch import)
            if line.strip():
                print(info_line(read_request(line)), flush=True)
        return
    print(info_line(args))


if __name__ == "__main__":
    main()
