"""Sudoku data: one on-disk format for Sudoku-Extreme CSVs and generated puzzles, plus torch loaders.

Builder and loader names are imported lazily: data building never pays for importing torch, and
`python -m trm.data.build` does not find its own module pre-imported by the package.
"""

from typing import Any

from .format import DatasetError, SplitMeta, fingerprint, load_split, read_meta, write_split
from .sudoku import augment, generate, solve, solve_count
from .sudoku_csv import read_csv, validate_pairs

_LAZY = {
    "TrainLoader": "loader",
    "EvalBatches": "loader",
    "eval_batches": "loader",
    "IGNORE_INDEX": "loader",
    "build_from_csv": "build",
    "build_generated": "build",
    "ensure_generated": "build",
}

__all__ = [
    "DatasetError",
    "SplitMeta",
    "fingerprint",
    "load_split",
    "read_meta",
    "write_split",
    "augment",
    "generate",
    "read_csv",
    "solve",
    "solve_count",
    "validate_pairs",
    "TrainLoader",
    "EvalBatches",
    "eval_batches",
    "IGNORE_INDEX",
    "build_from_csv",
    "build_generated",
    "ensure_generated",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
