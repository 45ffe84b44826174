"""Sudoku puzzles: solver, seeded generator, vectorized augmentation, validation and CSV reading.

Grids are flat length-81 arrays in row-major order; 0 means blank, 1..9 are digits. Tokens
(digit + 1) are only introduced by the builder, so everything here works in plain digits.

One module (~380 lines) on purpose: small, torch-free functions over one grid encoding (the row/column/box
tables and digit bitmasks below), which the solver, the generator and the validation all share.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from .format import DatasetError

MAX_BLANKS = 64  # 17 givens is the proven minimum for a unique solution
MIN_GIVENS = 81 - MAX_BLANKS
ALL_DIGITS = 0x3FE  # bits 1..9
_POP = [bin(m).count("1") for m in range(1024)]
_ROW = [i // 9 for i in range(81)]
_COL = [i % 9 for i in range(81)]
_BOX = [(i // 27) * 3 + (i % 9) // 3 for i in range(81)]
_BIT_DIGIT = {1 << d: d for d in range(1, 10)}
_MAX_GRID_ATTEMPTS = 50  # fresh full grids tried per puzzle before giving up
_AUG_CHUNK = 1 << 15  # augmented copies gathered per vectorized step (bounds temp memory)


# --------------------------------------------------------------------------------------------
# Solver


def _search(
    grid: list[int], limit: int, order: list[list[int]] | None = None, empties: list[int] | None = None
) -> list[list[int]]:
    """Bitmask backtracking on the most-constrained cell; returns up to ``limit`` solutions.

    ``order`` (per-cell digit order) turns it into a random filler; ``grid`` is modified.
    """
    rows, cols, boxes = [0] * 9, [0] * 9, [0] * 9
    for i, v in enumerate(grid):
        if v:
            bit = 1 << v
            r, c, b = _ROW[i], _COL[i], _BOX[i]
            if (rows[r] | cols[c] | boxes[b]) & bit:
                return []  # the givens already clash
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
    todo = [i for i in (empties if empties is not None else range(81)) if grid[i] == 0]
    sols: list[list[int]] = []

    def rec(k: int) -> bool:
        if k == 0:
            sols.append(grid.copy())
            return len(sols) >= limit
        best, best_cnt, best_mask = 0, 10, 0
        for j in range(k):
            i = todo[j]
            m = ALL_DIGITS & ~(rows[_ROW[i]] | cols[_COL[i]] | boxes[_BOX[i]])
            cnt = _POP[m]
            if cnt < best_cnt:
                best, best_cnt, best_mask = j, cnt, m
                if cnt <= 1:
                    break
        if best_cnt == 0:
            return False
        todo[best], todo[k - 1] = todo[k - 1], todo[best]
        i = todo[k - 1]
        r, c, b = _ROW[i], _COL[i], _BOX[i]
        digits = (
            [d for d in order[i] if best_mask >> d & 1]
            if order is not None
            else [_BIT_DIGIT[best_mask & -best_mask]]
            if best_cnt == 1
            else [d for d in range(1, 10) if best_mask >> d & 1]
        )
        for d in digits:
            bit = 1 << d
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
            grid[i] = d
            if rec(k - 1):
                return True
            rows[r] ^= bit
            cols[c] ^= bit
            boxes[b] ^= bit
        grid[i] = 0
        return False

    rec(len(todo))
    return sols


def solve(grid: Sequence[int] | np.ndarray, limit: int = 2) -> list[np.ndarray]:
    """Up to ``limit`` solutions (uint8 [81]) of a puzzle with 0 for blanks."""
    g = [int(v) for v in np.asarray(grid).reshape(81)]
    return [np.array(s, dtype=np.uint8) for s in _search(g, limit)]


def solve_count(grid: Sequence[int] | np.ndarray, limit: int = 2) -> int:
    """Number of solutions, counted up to ``limit`` (limit=2 answers "is it unique?")."""
    return len(_search([int(v) for v in np.asarray(grid).reshape(81)], limit))


# --------------------------------------------------------------------------------------------
# Generator


def _random_grid(rng: np.random.Generator) -> list[int]:
    """A random complete grid: random cell tie-breaking and random digit order per cell.

    Backtracking fill rather than permuting one canonical pattern, whose rigid band structure
    (every band built from the same three digit triples) a model could learn as a shortcut.
    """
    order = rng.permuted(np.tile(np.arange(1, 10), (81, 1)), axis=1).tolist()
    empties = rng.permutation(81).tolist()
    sols = _search([0] * 81, 1, order=order, empties=empties)
    return sols[0]


def _dig(sol: list[int], blanks: int, rng: np.random.Generator) -> list[int] | None:
    """Blank ``blanks`` random cells keeping a unique solution, or None if this grid fails.

    When a second solution exists, one blank where it differs is refilled (killing that
    solution) and the next cell of the random order is blanked instead, so the count stays exact.
    """
    cells = rng.permutation(81).tolist()
    puzzle = sol.copy()
    for i in cells[:blanks]:
        puzzle[i] = 0
    blanked = set(cells[:blanks])
    spare = cells[blanks:]
    while True:
        found = _search(puzzle.copy(), 2)
        if len(found) == 1:
            return puzzle
        alt = found[1] if found[0] == sol else found[0]
        diff = [i for i in cells if i in blanked and alt[i] != sol[i]]  # `cells` order: deterministic
        if not spare:
            return None
        refill = diff[int(rng.integers(len(diff)))]
        puzzle[refill] = sol[refill]
        blanked.discard(refill)
        new = spare.pop(0)
        puzzle[new] = 0
        blanked.add(new)


def generate(
    n: int, blanks: int, seed: int | np.random.SeedSequence, exclude: Collection[bytes] = ()
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` distinct unique-solution puzzles with exactly ``blanks`` blanks, deterministic in ``seed``.

    Returns (puzzles uint8 [n,81] with 0 for blank, solutions uint8 [n,81]). Puzzles whose bytes
    are in ``exclude`` are skipped (used to keep the test split disjoint from train).
    """
    if not isinstance(n, (int, np.integer)) or n < 0:
        raise DatasetError(f"n must be a non-negative integer, got {n!r}")
    if not isinstance(blanks, (int, np.integer)) or not 0 <= blanks <= MAX_BLANKS:
        raise DatasetError(
            f"blanks must be an integer in [0, {MAX_BLANKS}] (a unique solution needs at "
            f"least 17 givens), got {blanks!r}"
        )
    rng = np.random.default_rng(seed)
    puzzles = np.zeros((n, 81), dtype=np.uint8)
    solutions = np.zeros((n, 81), dtype=np.uint8)
    seen: set[bytes] = set()
    for k in range(n):
        for _ in range(_MAX_GRID_ATTEMPTS):
            sol = _random_grid(rng)
            puzzle = _dig(sol, int(blanks), rng)
            if puzzle is None:
                continue
            key = bytes(puzzle)
            if key in seen or key in exclude:
                continue
            seen.add(key)
            puzzles[k], solutions[k] = puzzle, sol
            break
        else:
            raise DatasetError(
                f"could not make a unique-solution puzzle with {blanks} blanks after {_MAX_GRID_ATTEMPTS} "
                f"fresh grids (puzzle {k}); random digging rarely gets past ~55 blanks: use fewer blanks "
                f"or the Sudoku-Extreme CSV source"
            )
    return puzzles, solutions


# --------------------------------------------------------------------------------------------
# Augmentation


def _random_perms(rng: np.random.Generator, m: int, size: int) -> np.ndarray:
    """[m, size] rows, each an independent uniform permutation of 0..size-1."""
    return rng.permuted(np.tile(np.arange(size, dtype=np.int64), (m, 1)), axis=1)


def _line_maps(rng: np.random.Generator, m: int) -> np.ndarray:
    """[m, 9] row (or column) maps: permute the 3 bands, then the 3 lines inside each band."""
    bands = _random_perms(rng, m, 3)
    within = _random_perms(rng, m * 3, 3).reshape(m, 3, 3)
    rows: np.ndarray = (bands[:, :, None] * 3 + within).reshape(m, 9)
    return rows


def augment(
    puzzles: np.ndarray, solutions: np.ndarray, num_aug: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each original followed by ``num_aug`` validity-preserving random transforms of it.

    A transform is: digit relabelling, optional transpose, band/row and stack/column permutations,
    applied identically to puzzle and solution. Output rows are group-major (original i at row
    i*(num_aug+1)), and group_ids (int64) gives the original index of every row.
    """
    puzzles = np.asarray(puzzles, dtype=np.uint8)
    solutions = np.asarray(solutions, dtype=np.uint8)
    if puzzles.ndim != 2 or puzzles.shape[1] != 81 or solutions.shape != puzzles.shape:
        raise DatasetError(f"puzzles/solutions must both be [n, 81], got {puzzles.shape} and {solutions.shape}")
    if num_aug < 0:
        raise DatasetError(f"num_aug must be >= 0, got {num_aug}")
    n, per = puzzles.shape[0], num_aug + 1
    out_p = np.empty((n * per, 81), dtype=np.uint8)
    out_s = np.empty((n * per, 81), dtype=np.uint8)
    out_p[::per] = puzzles
    out_s[::per] = solutions
    group_ids = np.repeat(np.arange(n, dtype=np.int64), per)
    m = n * num_aug
    if m == 0:
        return out_p, out_s, group_ids
    # All randomness is drawn up front so results do not depend on the chunk size below.
    digit_maps = np.zeros((m, 10), dtype=np.uint8)  # 0 (blank) always maps to 0
    digit_maps[:, 1:] = _random_perms(rng, m, 9) + 1
    transpose = rng.random(m) < 0.5
    row_maps = _line_maps(rng, m).astype(np.int16)
    col_maps = _line_maps(rng, m).astype(np.int16)
    flat_p, flat_s = puzzles.reshape(-1), solutions.reshape(-1)
    for s in range(0, m, _AUG_CHUNK):
        e = min(s + _AUG_CHUNK, m)
        r = row_maps[s:e].astype(np.int64)[:, :, None]  # output row i <- source row r[i]
        c = col_maps[s:e].astype(np.int64)[:, None, :]
        src = np.where(transpose[s:e, None, None], c * 9 + r, r * 9 + c).reshape(e - s, 81)
        j = np.arange(s, e)
        src += (j // num_aug * 81)[:, None]
        dest = j + j // num_aug + 1
        dm = digit_maps[s:e]
        out_p[dest] = np.take_along_axis(dm, flat_p[src], axis=1)
        out_s[dest] = np.take_along_axis(dm, flat_s[src], axis=1)
    return out_p, out_s, group_ids
