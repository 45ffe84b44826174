"""`python -m trm.info arch=<preset> [key=value ...]`: one JSON line describing a model config.
`python -m trm.info --batch`: the same for each JSON list of overrides read from stdin, one per line
(contracts/model_info.py: the lines, typed).

FLOPs come from trm/flops.py (torch's FlopCounterMode on one supervision step for one sample).
"""

from __future__ import annotations

import sys

from omegaconf import DictConfig

from contracts.hydra_app import compose_train_config, run_app, to_dict, train_group_lines
from contracts.model_info import BATCH_FLAG, ModelInfo, read_request
from trm.flops import flops_per_sample_step
from trm.model import ACTModel, TRMConfig, count_params


def arch_config(cfg: DictConfig) -> TRMConfig:
    return TRMConfig.from_dict(to_dict(cfg.arch))


def describe(cfg: DictConfig) -> ModelInfo:
    arch = arch_config(cfg)
    counts = count_params(ACTModel(arch))
    return ModelInfo(
        arch=to_dict(cfg.arch),
        params=counts["params"],
        puzzle_emb_params=counts["puzzle_emb_params"],
        flops_per_sample_step=flops_per_sample_step(arch),
        seq_len=arch.total_len,
        global_batch_size=int(cfg.train.global_batch_size),
        train_steps=int(cfg.train.steps),
        halt_max_steps=arch.halt_max_steps,
    )


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
                print(describe(compose_train_config(read_request(line))).line(), flush=True)
        return
    print(describe(compose_train_config(args)).line())


if __name__ == "__main__":
    main()
