"""Sudoku pairs from disk: reading Sudoku-Extreme-style CSVs (`.` or `0` for blanks) and validating that every
pair is a consistent puzzle with its solution, each error naming the file and line."""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence

import numpy as np

from .format import DatasetError
from .sudoku import ALL_DIGITS, MIN_GIVENS

_VALIDATE_CHUNK = 1 << 16
CSV_HEADER = ["source", "question", "answer", "rating"]


# --------------------------------------------------------------------------------------------
# Validation


def _describe(i: int, where: str, line_numbers: Sequence[int] | None) -> str:
    return f"{where}, line {int(line_numbers[i])}" if line_numbers is not None else f"{where}, row {i}"


def validate_pairs(
    puzzles: np.ndarray, solutions: np.ndarray, where: str, line_numbers: Sequence[int] | None = None
) -> None:
    """Raise DatasetError at the first row whose solution is not a valid grid solving its puzzle.

    ``line_numbers[i]`` (e.g. CSV line of row i) is used in the message when given.
    """
    puzzles, solutions = np.asarray(puzzles), np.asarray(solutions)
    if puzzles.ndim != 2 or puzzles.shape[1] != 81 or solutions.shape != puzzles.shape:
        raise DatasetError(
            f"{where}: puzzles/solutions must both be [n, 81], got {puzzles.shape} and {solutions.shape}"
        )
    for s in range(0, puzzles.shape[0], _VALIDATE_CHUNK):
        p, a = puzzles[s : s + _VALIDATE_CHUNK], solutions[s : s + _VALIDATE_CHUNK]
        problems: list[tuple[np.ndarray | np.bool_, str]] = [  # .any(1): numpy's stubs allow a scalar too
            (((p < 0) | (p > 9)).any(1), "puzzle has a value outside 0..9"),
            (((a < 1) | (a > 9)).any(1), "solution has a value outside 1..9"),
            (
                (p != 0).sum(1) < MIN_GIVENS,
                f"puzzle has fewer than {MIN_GIVENS} givens: no unique solution is possible",
            ),
        ]
        # Range problems are listed first, so values wrapped by the uint8 cast below are never blamed.
        p, a = p.astype(np.uint8, copy=False), a.astype(np.uint8, copy=False)
        problems.append((((p != 0) & (p != a)).any(1), "solution disagrees with a given cell of the puzzle"))
        bits = np.left_shift(np.uint16(1), np.minimum(a, 15).astype(np.uint16)).reshape(-1, 9, 9)
        for name, axes in (("row", 2), ("column", 1), ("box", (2, 4))):
            g = bits if name != "box" else bits.reshape(-1, 3, 3, 3, 3)
            seen = np.bitwise_or.reduce(g, axis=axes).reshape(g.shape[0], 9)
            problems.append(((seen != ALL_DIGITS).any(1), f"solution repeats a digit in a {name}"))
        first = [(int(np.argmax(bad)), msg) for bad, msg in problems if bad.any()]
        if first:
            i, msg = min(first, key=lambda t: t[0])
            i += s
            raise DatasetError(
                f"{_describe(i, where, line_numbers)}: {msg} "
                f"(puzzle {_grid_str(puzzles[i])}, solution {_grid_str(solutions[i])})"
            )


def _grid_str(g: np.ndarray) -> str:
    return "".join(str(int(v)) if 0 <= v <= 9 else "?" for v in np.asarray(g).reshape(-1))


# --------------------------------------------------------------------------------------------
# Sudoku-Extreme CSV

_Q_LUT = np.full(256, 255, dtype=np.uint8)
_Q_LUT[ord(".")] = 0
_Q_LUT[ord("0") : ord("9") + 1] = np.arange(10)
_A_LUT = np.full(256, 255, dtype=np.uint8)
_A_LUT[ord("1") : ord("9") + 1] = np.arange(1, 10)


def _parse_grids(cells: list[str], lut: np.ndarray, what: str, path: str, lines: list[int]) -> np.ndarray:
    """Vectorized string -> uint8 [n,81] via one joined byte buffer; errors name file and line."""
    lengths = np.fromiter((len(c) for c in cells), dtype=np.int64, count=len(cells))
    if (lengths != 81).any():
        i = int(np.argmax(lengths != 81))
        raise DatasetError(f"{path}, line {lines[i]}: {what} has {lengths[i]} cells, expected 81: {cells[i]!r}")
    try:
        buf = "".join(cells).encode("ascii")
    except UnicodeEncodeError:
        i = next(i for i, c in enumerate(cells) if not c.isascii())
        raise DatasetError(f"{path}, line {lines[i]}: {what} has a non-ASCII character: {cells[i]!r}") from None
    grids = lut[np.frombuffer(buf, dtype=np.uint8)].reshape(-1, 81)
    bad = grids == 255
    if bad.any():
        i = int(np.argmax(bad.any(1)))
        ch = cells[i][int(np.argmax(bad[i]))]
        raise DatasetError(f"{path}, line {lines[i]}: {what} has bad character {ch!r}: {cells[i]!r}")
    return grids


def _checked_rating(row: list[str], where: str) -> int:
    """A row's rating, after its source and rating are checked: a control character in the source (a NUL byte) is
    a corrupt file, and a rating is a whole number >= 0 (min_rating keeps rows by it)."""
    if any(ch < " " and ch != "\t" for ch in row[0]):
        raise DatasetError(
            f"{where}: source has a control character (a NUL byte?): {row[0]!r}; expected printable text"
        )
    try:
        rating = int(row[3])
    except ValueError:
        rating = -1
    if rating < 0:
        raise DatasetError(f"{where}: rating must be an integer >= 0, got {row[3]!r}")
    return rating


def read_csv(
    path: str | os.PathLike[str],
    min_rating: int = 0,
    subsample: int | None = None,
    seed: int = 0,
    lines_out: list[int] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Read a Sudoku-Extreme CSV (``source,question,answer,rating``; '.' or '0' = blank).

    Validates every row, keeps rating >= min_rating, then (if ``subsample`` is smaller than what
    is left) keeps a seeded random subset in file order. Returns (puzzles, solutions) uint8 [n,81];
    ``lines_out``, if given, is extended with the CSV line of each returned row.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise DatasetError(f"CSV file not found: {path}")
    questions: list[str] = []
    answers: list[str] = []
    ratings: list[int] = []
    lines: list[int] = []
    # utf-8-sig: a spreadsheet's "CSV UTF-8" export starts with a byte order mark, which is not part of the header.
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        try:
            header = next(reader, None)
            if header is None or [h.strip() for h in header] != CSV_HEADER:
                raise DatasetError(f"{path}, line 1: header must be {','.join(CSV_HEADER)}, got {header!r}")
            for row in reader:
                if not row:
                    continue  # blank line
                if len(row) != 4:
                    raise DatasetError(
                        f"{path}, line {reader.line_num}: expected 4 columns "
                        f"({','.join(CSV_HEADER)}), got {len(row)}: {row!r}"
                    )
                ratings.append(_checked_rating(row, f"{path}, line {reader.line_num}"))
                questions.append(row[1])
                answers.append(row[2])
                lines.append(reader.line_num)
        except (csv.Error, UnicodeDecodeError) as e:
            raise DatasetError(f"{path}, line {reader.line_num}: unreadable CSV ({e})") from e
    puzzles = _parse_grids(questions, _Q_LUT, "question", path, lines)
    solutions = _parse_grids(answers, _A_LUT, "answer", path, lines)
    validate_pairs(puzzles, solutions, path, line_numbers=lines)
    keep = np.flatnonzero(np.asarray(ratings, dtype=np.int64) >= min_rating)
    if subsample is not None:
        if subsample < 0:
            raise DatasetError(f"subsample must be >= 0, got {subsample}")
        if subsample < keep.size:
            pick = np.random.default_rng(seed).choice(keep.size, size=subsample, replace=False)
            keep = keep[np.sort(pick)]
    if lines_out is not None:
        lines_out.extend(int(lines[k]) for k in keep)
    return puzzles[keep].copy(), solutions[keep].copy()
