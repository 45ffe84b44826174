"""The noise of an eval: the standard error of a share of puzzles solved. One definition for the re-evaluation
(trm/reeval.py), the evidence-checking pruner (contracts/pruning/evidence.py) and the benches that judge a study's
answer by it (bench/trm_bench/table.py). Pure arithmetic: no torch."""

from __future__ import annotations

import math


def binomial_stderr(value: float, examples: int) -> float:
    """One standard error of a share `value` measured on `examples` independent puzzles: the half-width of the
    Wilson score interval at z = 1 (68%). Where the normal approximation holds it is sqrt(p(1-p)/n) to within
    1/n; at a share of 0 or 1 it is not 0, as Wald's sqrt(p(1-p)/n) is: 0 of 32 solved is no certainty, and a
    zero error would rank 2 of 32 above 0 of 32 beyond the eval's noise. By hand: a share of cells is no whole
    count, which scipy's interval (tests compare the two on counts) takes."""
    n = max(examples, 1)
    return math.sqrt(max(value * (1.0 - value), 0.0) / n + 1 / (4 * n * n)) / (1 + 1 / n)
