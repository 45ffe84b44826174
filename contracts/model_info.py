"""What `python -m trm.info` prints for one training config, one JSON line each, and how the sweep's dry run
(sweeps/config/estimate.py) asks for many at once: `--batch` reads one JSON list of overrides per stdin line and answers
one `ModelInfo` line per request, in order, from one interpreter.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

BATCH_FLAG = "--batch"


@dataclass(frozen=True)
class ModelInfo:
    """A config's model, counted on the meta device (trm/flops.py): no arithmetic runs."""

    arch: dict[str, Any]  # the arch block as composed
    params: int  # trainable, without the puzzle embedding (as the paper counts)
    puzzle_emb_params: int
    flops_per_sample_step: int  # one supervision step of one sample, forward and backward
    seq_len: int
    global_batch_size: int
    train_steps: int
    halt_max_steps: int

    def line(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def parse(cls, line: str) -> ModelInfo:
        return cls(**json.loads(line))


def request_lines(trials: list[list[str]]) -> str:
    """The `--batch` input: one JSON list of overrides per line."""
    return "".join(json.dumps(list(overrides)) + "\n" for overrides in trials)


def read_request(line: str) -> list[str]:
    return [str(o) for o in json.loads(line)]
