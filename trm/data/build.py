"""Build a dataset directory from Sudoku-Extreme CSVs or from generated puzzles (API + CLI).

Every build is atomic (trm/data/atomic_build.py: a reader never sees half a dataset, concurrent builds cannot
corrupt each other, a killed build's leftovers are cleaned by the next). Same arguments give byte-identical arrays
(only seeded numpy Generators are used).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .atomic_build import build_atomically, dataset_summary, remove_stale_builds
from .format import SPLITS, DatasetError, SplitMeta, load_split, write_split
from .leaks import check_splits, warn_same_file
from .sudoku import augment, generate
from .sudoku_csv import read_csv

FORMAT_VERSION = 1


def _arrays(puzzles: np.ndarray, solutions: np.ndarray, per_group: int) -> dict[str, np.ndarray]:
    """Token arrays for one split: one example per puzzle, ``per_group`` consecutive puzzles per group."""
    n = puzzles.shape[0]
    if n % per_group:
        raise DatasetError(f"{n} puzzles do not split into groups of {per_group}")
    return {
        "inputs": puzzles + np.uint8(1),  # 0 blank -> token 1, digit d -> d + 1 (kept uint8 until written)
        "labels": solutions + np.uint8(1),
        "puzzle_identifiers": np.zeros(n, dtype=np.int32),
        "puzzle_indices": np.arange(n + 1, dtype=np.int32),
        "group_indices": np.arange(0, n + 1, per_group, dtype=np.int32),
    }


def _generated_source(num_train: int, num_test: int, blanks: int, seed: int, num_aug: int) -> dict[str, Any]:
    return {
        "kind": "generate",
        "format_version": FORMAT_VERSION,
        "num_train": int(num_train),
        "num_test": int(num_test),
        "blanks": int(blanks),
        "seed": int(seed),
        "num_aug": int(num_aug),
    }


def _write_generated(tmp: Path, source: dict[str, Any]) -> dict[str, SplitMeta]:
    train_ss, test_ss, aug_ss = np.random.SeedSequence(source["seed"]).spawn(3)
    tr_p, tr_s = generate(source["num_train"], source["blanks"], train_ss)
    te_p, te_s = generate(source["num_test"], source["blanks"], test_ss, exclude={bytes(p) for p in tr_p})
    k = source["num_aug"]
    tr_p, tr_s, _ = augment(tr_p, tr_s, k, np.random.default_rng(aug_ss))
    return {
        "train": write_split(tmp, "train", _arrays(tr_p, tr_s, k + 1), source),
        "test": write_split(tmp, "test", _arrays(te_p, te_s, 1), source),
    }


def _check_counts(**kw: int) -> None:
    for name, v in kw.items():
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
            raise DatasetError(f"{name} must be a non-negative integer, got {v!r}")


def _check_generated_splits(num_train: int, num_test: int) -> None:
    """An empty split builds fine and fails only when a run trains or evaluates on it: refuse it here."""
    for name, v in (("num_train", num_train), ("num_test", num_test)):
        if v == 0:
            raise DatasetError(
                f"{name}=0 (--{name.replace('_', '-')}, data.{name}) would build an empty "
                f"{name[4:]} split, which no run can use: give at least 1"
            )


def build_generated(
    out: str | os.PathLike[str], num_train: int, num_test: int, blanks: int, seed: int, num_aug: int = 0
) -> dict[str, Any]:
    """Generate train/test (distinct seeds spawned from ``seed``; test disjoint from train) into ``out``.

    Replaces an existing dataset at ``out``. Returns the summary printed by the CLI.
    """
    _check_counts(num_train=num_train, num_test=num_test, blanks=blanks, seed=seed, num_aug=num_aug)
    _check_generated_splits(num_train, num_test)
    source = _generated_source(num_train, num_test, blanks, seed, num_aug)
    return build_atomically(out, lambda tmp: _write_generated(tmp, source), replace=True)[0]


def build_from_csv(
    out: str | os.PathLike[str],
    train_csv: str | os.PathLike[str],
    test_csv: str | os.PathLike[str],
    subsample: int | None = None,
    num_aug: int = 0,
    seed: int = 0,
    min_rating: int = 0,
    allow_overlap: bool = False,
) -> dict[str, Any]:
    """Build from Sudoku-Extreme CSVs: ``min_rating`` filters both splits, ``subsample`` and
    ``num_aug`` apply to train only (test stays complete and unaugmented, as in the TRM setup).
    Test puzzles that are train puzzles are refused unless ``allow_overlap`` (trm/data/leaks.py)."""
    _check_counts(num_aug=num_aug, seed=seed)
    if subsample is not None:
        _check_counts(subsample=subsample)
        if subsample == 0:
            raise DatasetError(
                "subsample=0 (--subsample 0) keeps no training puzzles, so the train split would be "
                "empty: give a positive number, or leave --subsample out to keep them all"
            )
    warn_same_file(train_csv, test_csv)
    source = {
        "kind": "csv",
        "format_version": FORMAT_VERSION,
        "train_csv": str(train_csv),
        "test_csv": str(test_csv),
        "subsample": subsample,
        "num_aug": int(num_aug),
        "seed": int(seed),
        "min_rating": int(min_rating),
    }

    def write(tmp: Path) -> dict[str, SplitMeta]:
        sub_ss, aug_ss = np.random.SeedSequence(seed).spawn(2)
        sub_seed = int(sub_ss.generate_state(1)[0])
        lines: tuple[list[int], list[int]] = ([], [])
        tr_p, tr_s = read_csv(train_csv, min_rating, subsample, sub_seed, lines_out=lines[0])
        te_p, te_s = read_csv(test_csv, min_rating=min_rating, lines_out=lines[1])
        rated = f" with rating >= {min_rating} (--min-rating)" if min_rating else ""
        for split, path, n in (("train", train_csv, tr_p.shape[0]), ("test", test_csv, te_p.shape[0])):
            if n == 0:
                raise DatasetError(
                    f"{path} has no puzzles{rated}: the {split} split would be empty, which no run "
                    f"can use (--{split}-csv)"
                )
        if subsample is not None and tr_p.shape[0] < subsample:
            raise DatasetError(
                f"--subsample {subsample} asks for more training puzzles than {train_csv} has "
                f"({tr_p.shape[0]}{rated}): give at most {tr_p.shape[0]}, or leave --subsample out"
            )
        check_splits(tr_p, te_p, (str(train_csv), str(test_csv)), lines, allow_overlap)
        tr_p, tr_s, _ = augment(tr_p, tr_s, num_aug, np.random.default_rng(aug_ss))
        return {
            "train": write_split(tmp, "train", _arrays(tr_p, tr_s, num_aug + 1), source),
            "test": write_split(tmp, "test", _arrays(te_p, te_s, 1), source),
        }

    return build_atomically(out, write, replace=True)[0]


def _existing(out: Path, source: dict[str, Any]) -> dict[str, Any] | None:
    """Summary of a complete dataset at ``out`` built with ``source``; None if ``out`` is absent/empty."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return None
    metas = {}
    for split in SPLITS:
        _, meta = load_split(out, split)  # raises DatasetError naming the path if incomplete
        if meta.source != source:
            keys = sorted(set(meta.source) | set(source))
            diff = {
                k: {"existing": meta.source.get(k), "requested": source.get(k)}
                for k in keys
                if meta.source.get(k) != source.get(k)
            }
            raise DatasetError(
                f"{out} already holds a different dataset ({split} differs: {diff}); "
                f"delete it or choose another directory"
            )
        metas[split] = meta
    return dataset_summary(out.absolute(), metas)


def ensure_generated(
    out: str | os.PathLike[str], num_train: int, num_test: int, blanks: int, seed: int, num_aug: int = 0
) -> dict[str, Any]:
    """Build like ``build_generated`` unless ``out`` already holds exactly that dataset.

    Safe for concurrent callers on one machine: each builds in its own temp dir; the first rename
    wins and the others discard their copy and use the winner's.
    """
    _check_counts(num_train=num_train, num_test=num_test, blanks=blanks, seed=seed, num_aug=num_aug)
    _check_generated_splits(num_train, num_test)
    out_p = Path(out)
    source = _generated_source(num_train, num_test, blanks, seed, num_aug)
    remove_stale_builds(out_p)  # also when the dataset is there: a killed rebuild of it left its temp dirs
    found = _existing(out_p, source)
    if found is not None:
        return found
    summary, won = build_atomically(out_p, lambda tmp: _write_generated(tmp, source), replace=False)
    if won:
        return summary
    found = _existing(out_p, source)
    assert found is not None
    return found


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m trm.data.build", description=__doc__.split("\n")[0])
    p.add_argument("--source", choices=("csv", "generate"), required=True)
    p.add_argument("--out", required=True, help="dataset directory to (re)create")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-aug", type=int, default=0, help="augmented copies per train puzzle")
    g = p.add_argument_group("--source csv")
    g.add_argument("--train-csv")
    g.add_argument("--test-csv")
    g.add_argument("--subsample", type=int, default=None, help="keep N train puzzles (seeded)")
    g.add_argument("--min-rating", type=int, default=0)
    g.add_argument("--allow-overlap", action="store_true", help="build even if test puzzles are train puzzles")
    g = p.add_argument_group("--source generate")
    g.add_argument("--num-train", type=int)
    g.add_argument("--num-test", type=int)
    g.add_argument("--blanks", type=int)
    args = p.parse_args(argv)
    need = ("train_csv", "test_csv") if args.source == "csv" else ("num_train", "num_test", "blanks")
    missing = ["--" + n.replace("_", "-") for n in need if getattr(args, n) is None]
    if missing:
        p.error(f"--source {args.source} requires {', '.join(missing)}")
    try:
        if args.source == "csv":
            summary = build_from_csv(
                args.out,
                args.train_csv,
                args.test_csv,
                subsample=args.subsample,
                num_aug=args.num_aug,
                seed=args.seed,
                min_rating=args.min_rating,
                allow_overlap=args.allow_overlap,
            )
        else:
            summary = build_generated(
                args.out, args.num_train, args.num_test, args.blanks, args.seed, num_aug=args.num_aug
            )
    except DatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
