"""Schedules as pure functions of training progress (0 at the first step, 1 at the end).

Curriculum on recursion: H_cycles/L_cycles step up from their start values to the architecture's over the
first `end_fraction` of training in `stages` discrete levels, so the model compiles once per level (an XLA
graph is specialized on the recursion depth). Adaptive halting: the exploration probability decays
linearly from its initial value to a final value; it is a tensor input of the step, so no recompile.
"""

from __future__ import annotations

import math

from contracts.train_config import CurriculumConfig, HaltingConfig


def curriculum_stage(progress: float, cfg: CurriculumConfig) -> int:
    """Index of the curriculum level in use at `progress` (0 .. stages-1)."""
    if not cfg.enabled:
        return 0
    return int(min(cfg.stages - 1, math.floor(progress / cfg.end_fraction * (cfg.stages - 1))))


def recursion_at(progress: float, cfg: CurriculumConfig, h_final: int, l_final: int) -> tuple[int, int]:
    """(H_cycles, L_cycles) to use at `progress`; the arch values once the curriculum is over."""
    if not cfg.enabled:
        return h_final, l_final
    stage = curriculum_stage(progress, cfg)
    frac = stage / (cfg.stages - 1)
    h = cfg.start_H_cycles + round((h_final - cfg.start_H_cycles) * frac)
    l_cycles = cfg.start_L_cycles + round((l_final - cfg.start_L_cycles) * frac)
    return h, l_cycles


def exploration_at(progress: float, cfg: HaltingConfig) -> float:
    """Probability of forcing a random minimum number of ACT steps at `progress`."""
    if not cfg.adaptive:
        return cfg.exploration_prob
    frac = min(1.0, progress / cfg.decay_end_fraction) if cfg.decay_end_fraction > 0 else 1.0
    return cfg.exploration_prob + (cfg.final_exploration_prob - cfg.exploration_prob) * frac


def validate_curriculum(curriculum: CurriculumConfig, h_final: int, l_final: int) -> None:
    """Fail before training on a curriculum that cannot grow to the arch values: its own ranges are its schema's
    (contracts/train_config.py CurriculumConfig), the start values must not exceed the arch's."""
    if not curriculum.enabled:
        return
    for key, start, final in (
        ("start_H_cycles", curriculum.start_H_cycles, h_final),
        ("start_L_cycles", curriculum.start_L_cycles, l_final),
    ):
        if start > final:
            raise ValueError(f"curriculum.{key}={start}: expected 1 <= value <= the arch value {final}")
