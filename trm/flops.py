"""FLOPs of one supervision step, counted by torch's own FlopCounterMode rather than a formula.

The count runs the real step on the meta device (forward through every H/L cycle, the no-grad ones included, plus
backward of the last cycle) for one sample, so it follows the code rather than a formula that could drift from it.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from trm.losses import act_loss
from trm.model import ACTModel, TRMConfig


def flops_per_sample_step(arch: TRMConfig, h_cycles: int | None = None, l_cycles: int | None = None) -> int:
    """FLOPs of one supervision step (forward + backward) for one sample.

    Counted on the meta device: the ops and shapes of a real step without the arithmetic (a fraction of a real
    step's time on a CPU: every trial's rank 0 counts once before training). It
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
