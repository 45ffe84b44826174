"""Leaks between and within the CSV splits of a build: duplicated puzzles, and test puzzles that are train puzzles.

A test split that shares puzzles with the train split measures memorisation, not generalisation, and a duplicated
row weighs more than the others. Puzzles are compared by content after a cheap canonicalisation: digits relabelled
in order of first appearance (row-major) and the smaller of that and the transpose's, so a copy that only renamed
the digits or transposed the grid is found too. (The band, stack, row and column shuffles that `augment` also applies
are not undone: a full canonical form of a Sudoku under its 3,359,232 symmetries costs far more than a build.)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import numpy as np

from .format import DatasetError

_CHUNK = 1 << 16  # rows canonicalised per step (bounds the temporary [rows, 81] masks)
SAME_UP_TO = "the same grid up to a relabelling of the digits or a transpose"


def _relabel(p: np.ndarray) -> np.ndarray:
    """Digits renamed 1, 2, ... in the order they first appear in each row; blanks stay 0."""
    first = np.full((p.shape[0], 9), 81, dtype=np.int16)
    for d in range(1, 10):
        hit = p == d
        first[:, d - 1] = np.where(hit.any(1), hit.argmax(1), 81)
    order = np.argsort(first, axis=1, kind="stable")  # order[:, k]: the (k+1)-th digit to appear, minus one
    mapping = np.zeros((p.shape[0], 10), dtype=np.uint8)
    np.put_along_axis(mapping[:, 1:], order, np.arange(1, 10, dtype=np.uint8)[None, :].repeat(p.shape[0], 0), axis=1)
    return np.take_along_axis(mapping, p.astype(np.intp), axis=1)


def canonical_keys(puzzles: np.ndarray) -> np.ndarray:
    """One comparable key per puzzle ([n] of 81-byte values): equal for puzzles equal up to a digit relabelling
    or a transpose."""
    keys = np.empty((puzzles.shape[0], 81), dtype=np.uint8)
    for s in range(0, puzzles.shape[0], _CHUNK):
        p = np.asarray(puzzles[s : s + _CHUNK], dtype=np.uint8)
        a = _relabel(p)
        b = _relabel(p.reshape(-1, 9, 9).transpose(0, 2, 1).reshape(-1, 81))
        differ = a != b
        at = differ.argmax(1)
        rows = np.arange(a.shape[0])
        take_b = differ.any(1) & (b[rows, at] < a[rows, at])
        keys[s : s + _CHUNK] = np.where(take_b[:, None], b, a)
    return np.ascontiguousarray(keys).view(np.dtype((np.void, 81))).reshape(-1)


def _duplicates(keys: np.ndarray) -> tuple[int, tuple[int, int] | None]:
    """How many rows repeat an earlier row's key, and the first such (row, earlier row)."""
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    earlier = first[inverse.reshape(-1)]
    repeats = np.flatnonzero(earlier != np.arange(keys.size))
    return int(repeats.size), (int(repeats[0]), int(earlier[repeats[0]])) if repeats.size else None


def check_splits(
    train: np.ndarray,
    test: np.ndarray,
    files: tuple[str | os.PathLike[str], str | os.PathLike[str]],
    lines: tuple[Sequence[int], Sequence[int]],
    allow_overlap: bool = False,
) -> None:
    """Warn (stderr) about duplicated puzzles in either split; refuse test puzzles that are train puzzles unless
    `allow_overlap` (then a warning). `lines[i][r]` is the CSV line of row r of split i, for the messages."""
    keys = (canonical_keys(train), canonical_keys(test))
    for split, path, key, line in zip(("train", "test"), files, keys, lines):
        count, example = _duplicates(key)
        if example is not None:
            weigh = "weigh more in training" if split == "train" else "count more than once in the test accuracy"
            _warn(
                f"{path} has {count} duplicated puzzle(s) ({SAME_UP_TO}), e.g. line {line[example[0]]} repeats "
                f"line {line[example[1]]}: they {weigh}"
            )
    inside = np.flatnonzero(np.isin(keys[1], keys[0]))
    if inside.size == 0:
        return
    where = {k.tobytes(): i for i, k in reversed(list(enumerate(keys[0])))}
    first = int(inside[0])
    found = (
        f"{inside.size} of {test.shape[0]} test puzzles ({files[1]}) are also training puzzles ({files[0]}) "
        f"({SAME_UP_TO}), e.g. test line {lines[1][first]} is train line {lines[0][where[keys[1][first].tobytes()]]}"
    )
    if not allow_overlap:
        raise DatasetError(
            f"{found}: the test split would measure puzzles the model trained on; remove them from one file, or "
            "pass --allow-overlap to build anyway"
        )
    _warn(f"{found}; built anyway (--allow-overlap): the test split partly measures memorisation")


def warn_same_file(train_csv: str | os.PathLike[str], test_csv: str | os.PathLike[str]) -> None:
    """The same file given twice (also through a link) is named before anything is read."""
    if os.path.isfile(train_csv) and os.path.isfile(test_csv) and os.path.samefile(train_csv, test_csv):
        _warn(
            f"the train and test CSVs are the same file ({train_csv}): the test split then measures "
            "memorisation, not generalisation; give --test-csv a held-out file"
        )


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)
