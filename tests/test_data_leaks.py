"""Leaky data: `trm.data.build --source csv` reports duplicated puzzles, refuses test puzzles that
are train puzzles unless --allow-overlap, and refuses a question with fewer than 17 givens naming its line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.test_data import _csv_rows, _run_cli, _write_csv
from trm.data import generate
from trm.data.leaks import canonical_keys

pytestmark = pytest.mark.slow  # every test here starts processes or trains


@pytest.fixture(scope="module")
def puzzles() -> tuple[np.ndarray, np.ndarray]:
    return generate(12, 45, seed=11)


def _relabelled(grid: np.ndarray) -> np.ndarray:
    perm = np.array([0, 9, 8, 7, 6, 5, 4, 3, 2, 1], dtype=np.uint8)  # blanks stay blank
    return perm[grid]


def _transposed(grid: np.ndarray) -> np.ndarray:
    return grid.reshape(-1, 9, 9).transpose(0, 2, 1).reshape(grid.shape)


def _build(tmp_path: Path, train: list[list[str]], test: list[list[str]], *extra: str):
    args = ["--source", "csv", "--train-csv", str(_write_csv(tmp_path / "train.csv", train))]
    args += ["--test-csv", str(_write_csv(tmp_path / "test.csv", test)), "--out", str(tmp_path / "ds"), *extra]
    return _run_cli(*args)


def test_canonical_keys_match_relabelled_and_transposed_copies_only(puzzles) -> None:
    p = puzzles[0]
    keys = canonical_keys(np.stack([p[0], _relabelled(p[0]), _transposed(_relabelled(p[0])), p[1]]))
    assert keys[0] == keys[1] == keys[2] and keys[0] != keys[3]
    assert np.unique(canonical_keys(p)).size == p.shape[0]  # the generated puzzles are all different


def test_duplicated_rows_are_reported_naming_their_lines(tmp_path: Path, puzzles) -> None:
    p, s = puzzles
    train = _csv_rows(p[:8], s[:8])
    train.append(list(train[2]))  # line 10 repeats line 4 (header is line 1)
    train += _csv_rows(_relabelled(p[5:6]), _relabelled(s[5:6]))  # line 11: line 7 with its digits renamed
    test = _csv_rows(p[8:], s[8:])
    test.append(list(test[0]))  # test line 6 repeats test line 2
    proc = _build(tmp_path, train, test)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2, proc.stderr
    assert "train.csv has 2 duplicated puzzle(s)" in warnings[0] and "line 10 repeats line 4" in warnings[0]
    assert "test.csv has 1 duplicated puzzle(s)" in warnings[1] and "line 6 repeats line 2" in warnings[1]
    assert json.loads(proc.stdout)["train"]["examples"] == 10  # reported, still built


def test_test_puzzles_inside_train_are_refused_unless_allowed(tmp_path: Path, puzzles) -> None:
    """The whole test set inside train, one of them transposed: refused, naming a test line and its train line."""
    p, s = puzzles
    train = _csv_rows(p[:8], s[:8]) + _csv_rows(_transposed(p[8:9]), _transposed(s[8:9]))
    test = _csv_rows(p[8:10], s[8:10])
    train += _csv_rows(p[9:10], s[9:10])
    proc = _build(tmp_path, train, test)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    (error,) = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert "2 of 2 test puzzles" in error and "test line 2 is train line 10" in error and "--allow-overlap" in error
    assert not (tmp_path / "ds").exists()
    proc = _build(tmp_path, train, test, "--allow-overlap")
    assert proc.returncode == 0, proc.stderr
    assert "2 of 2 test puzzles" in proc.stderr and "built anyway (--allow-overlap)" in proc.stderr


def test_a_test_csv_that_is_a_byte_copy_of_train_is_refused(tmp_path: Path, puzzles) -> None:
    rows = _csv_rows(*puzzles)
    proc = _build(tmp_path, rows, rows)  # two files, same bytes: not the same file, so only content tells
    assert proc.returncode == 2 and f"{len(rows)} of {len(rows)} test puzzles" in proc.stderr, proc.stderr


@pytest.mark.parametrize("blanks", [81, 65])
def test_a_question_with_fewer_than_17_givens_is_refused_naming_its_line(tmp_path: Path, puzzles, blanks: int) -> None:
    p, s = puzzles
    train = _csv_rows(p[:6], s[:6])
    question = s[3].copy()
    question[:blanks] = 0  # 81 blanks: no givens at all; 65: 16 givens
    train[3][1] = "".join(map(str, question))
    proc = _build(tmp_path, train, _csv_rows(p[6:], s[6:]))
    assert proc.returncode == 2, proc.stderr
    assert "train.csv, line 5" in proc.stderr and "fewer than 17 givens" in proc.stderr, proc.stderr
