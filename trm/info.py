"""`python -m trm.info arch=<preset> [key=value ...]`: one JSON line describing a model config.
`python -m trm.info --batch`: the same for each JSON list of overrides read from stdin, one per line.

FLOPs are counted by torch's own FlopCounterMode on one supervision step on the meta device (forward through every
H/L cycle, the no-grad ones included, plus backward of the last cycle) for one sample, so they follow the
code rather than a formula that could drift from it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.flop_counter import FlopCounterMode

from trm.config import compose_train_config
from trm.losses import act_loss
from trm.model import ACTModel, TRMConfig, count_params

__all__ = ["compose_train_config", "describe", "flops_per_sample_step"]


def arch_config(cfg: DictConfig) -> TRMConfig:
    return TRMConfig.from_dict(OmegaConf.to_container(cfg.arch, resolve=True))


def flops_per_sample_step(arch: TRMConfig, h_cycles: int | None = None, l_cycles: int | None = None) -> int:
    """FLOPs of one supervision step (forward + backward) for one sample.

    Counted on the meta device: the ops and shapes of a real step without the arithmetic (a real step of the
    paper config took 15.7 s here, the meta one 0.7 s; every trial's rank 0 counts once before training). It
    also counts attention's two products, which a real CPU step runs in a fused flash kernel FlopCounterMode
    does not count (tests/test_model.py checks both against a real step). It draws nothing from the CPU RNG."""
    with torch.device("meta"):
        model = ACTModel(arch)
        batch = {
            "inputs": torch.randint(1, arch.vocab_size, (1, arch.seq_len)),
            "labels": torch.randint(2, arch.vocab_size, (1, arch.seq_len)),
            "puzzle_identifiers": torch.zeros(1, dtype=torch.long),
        }
        carry = model.initial_carry(batch)
        with FlopCounterMode(display=False) as counter:
            carry, logits, q_halt = model(carry, batch, 0.0, h_cycles, l_cycles)
            loss, _ = act_loss(logits, q_halt, carry.labels, carry.inputs, carry.halted, carry.steps)
            loss.backward()
    return int(counter.get_total_flops())


def describe(cfg: DictConfig) -> dict[str, Any]:
    arch = arch_config(cfg)
    return {
        "arch": OmegaConf.to_container(cfg.arch, resolve=True),
        **count_params(ACTModel(arch)),
        "flops_per_sample_step": flops_per_sample_step(arch),
        "seq_len": arch.total_len,
        "global_batch_size": cfg.train.global_batch_size,
        "train_steps": cfg.train.steps,
        "halt_max_steps": arch.halt_max_steps,
    }


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--batch"]:  # one JSON list of overrides per stdin line, one JSON line out for each
        for line in sys.stdin:  # (the sweep's dry run prices every trial with one interpreter and one torch import)
            if line.strip():
                print(json.dumps(describe(compose_train_config(json.loads(line)))), flush=True)
        return
    print(json.dumps(describe(compose_train_config(args))))


if __name__ == "__main__":
    main()
