"""Build a dataset directory from Sudoku-Extreme CSVs or from generated puzzles (API + CLI).

Every build writes into a unique temp dir next to ``out`` and renames it into place, so a reader
never sees half a dataset and concurrent ``ensure_generated`` calls cannot corrupt each other.
Same arguments give byte-identical arrays (only seeded numpy Generators are used).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .format import SPLITS, DatasetError, SplitMeta, load_split, write_split
from .sudoku import augment, generate, read_csv

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


def _summary(out: Path, metas: dict[str, SplitMeta]) -> dict[str, Any]:
    return {"out": str(out), **{s: {"examples": m.examples, "groups": m.groups, "fingerprint": m.fingerprint}
                                for s, m in metas.items()}}


def _is_replaceable(out: Path) -> bool:
    """Only an empty dir or one that looks like a dataset may be replaced (never `--out /tmp`)."""
    entries = {p.name for p in out.iterdir()}
    return not entries or (entries <= set(SPLITS) and all((out / s / "dataset.json").is_file() for s in entries))


def _build_atomically(out: str | os.PathLike, write: Callable[[Path], dict[str, SplitMeta]],
                      replace: bool) -> tuple[dict[str, Any], bool]:
    """Run ``write(tmp_dir)`` then rename the temp dir to ``out``.

    Returns (summary, True) on success. If ``replace`` is False and ``out`` was filled by someone
    else meanwhile, discards our copy and returns ({}, False) so the caller can use theirs.
    """
    out = Path(out).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    old: Path | None = None
    try:
        tmp.mkdir()
        metas = write(tmp)
        if out.exists() and replace:
            if not out.is_dir() or not _is_replaceable(out):
                raise DatasetError(f"refusing to replace {out}: it exists and is not a dataset directory")
            old = out.parent / f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.rename(out, old)
        try:
            os.rename(tmp, out)  # atomic; also replaces an empty directory
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR) and not replace:
                return {}, False
            raise
        return _summary(out, metas), True
    finally:
        for p in (tmp, old):
            if p is not None and p.exists():
                shutil.rmtree(p, ignore_errors=True)


def _generated_source(num_train: int, num_test: int, blanks: int, seed: int, num_aug: int) -> dict[str, Any]:
    return {"kind": "generate", "format_version": FORMAT_VERSION, "num_train": int(num_train),
            "num_test": int(num_test), "blanks": int(blanks), "seed": int(seed), "num_aug": int(num_aug)}


def _write_generated(tmp: Path, source: dict[str, Any]) -> dict[str, SplitMeta]:
    train_ss, test_ss, aug_ss = np.random.SeedSequence(source["seed"]).spawn(3)
    tr_p, tr_s = generate(source["num_train"], source["blanks"], train_ss)
    te_p, te_s = generate(source["num_test"], source["blanks"], test_ss, exclude={bytes(p) for p in tr_p})
    k = source["num_aug"]
    tr_p, tr_s, _ = augment(tr_p, tr_s, k, np.random.default_rng(aug_ss))
    return {"train": write_split(tmp, "train", _arrays(tr_p, tr_s, k + 1), source),
            "test": write_split(tmp, "test", _arrays(te_p, te_s, 1), source)}


def _check_counts(**kw: int) -> None:
    for name, v in kw.items():
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
            raise DatasetError(f"{name} must be a non-negative integer, got {v!r}")


def build_generated(out: str | os.PathLike, num_train: int, num_test: int, blanks: int, seed: int,
                    num_aug: int = 0) -> dict[str, Any]:
    """Generate train/test (distinct seeds spawned from ``seed``; test disjoint from train) into ``out``.

    Replaces an existing dataset at ``out``. Returns the summary printed by the CLI.
    """
    _check_counts(num_train=num_train, num_test=num_test, blanks=blanks, seed=seed, num_aug=num_aug)
    source = _generated_source(num_train, num_test, blanks, seed, num_aug)
    return _build_atomically(out, lambda tmp: _write_generated(tmp, source), replace=True)[0]


def build_from_csv(out: str | os.PathLike, train_csv: str | os.PathLike, test_csv: str | os.PathLike,
                   subsample: int | None = None, num_aug: int = 0, seed: int = 0,
                   min_rating: int = 0) -> dict[str, Any]:
    """Build from Sudoku-Extreme CSVs: ``min_rating`` filters both splits, ``subsample`` and
    ``num_aug`` apply to train only (test stays complete and unaugmented, as in the TRM setup)."""
    _check_counts(num_aug=num_aug, seed=seed)
    if subsample is not None:
        _check_counts(subsample=subsample)
    source = {"kind": "csv", "format_version": FORMAT_VERSION, "train_csv": str(train_csv),
              "test_csv": str(test_csv), "subsample": subsample, "num_aug": int(num_aug), "seed": int(seed),
              "min_rating": int(min_rating)}

    def write(tmp: Path) -> dict[str, SplitMeta]:
        sub_ss, aug_ss = np.random.SeedSequence(seed).spawn(2)
        sub_seed = int(sub_ss.generate_state(1)[0])
        tr_p, tr_s = read_csv(train_csv, min_rating=min_rating, subsample=subsample, seed=sub_seed)
        te_p, te_s = read_csv(test_csv, min_rating=min_rating)
        tr_p, tr_s, _ = augment(tr_p, tr_s, num_aug, np.random.default_rng(aug_ss))
        return {"train": write_split(tmp, "train", _arrays(tr_p, tr_s, num_aug + 1), source),
                "test": write_split(tmp, "test", _arrays(te_p, te_s, 1), source)}

    return _build_atomically(out, write, replace=True)[0]


def _existing(out: Path, source: dict[str, Any]) -> dict[str, Any] | None:
    """Summary of a complete dataset at ``out`` built with ``source``; None if ``out`` is absent/empty."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return None
    metas = {}
    for split in SPLITS:
        _, meta = load_split(out, split)  # raises DatasetError naming the path if incomplete
        if meta.source != source:
            keys = sorted(set(meta.source) | set(source))
            diff = {k: {"existing": meta.source.get(k), "requested": source.get(k)}
                    for k in keys if meta.source.get(k) != source.get(k)}
            raise DatasetError(f"{out} already holds a different dataset ({split} differs: {diff}); "
                               f"delete it or choose another directory")
        metas[split] = meta
    return _summary(out.absolute(), metas)


def ensure_generated(out: str | os.PathLike, num_train: int, num_test: int, blanks: int, seed: int,
                     num_aug: int = 0) -> dict[str, Any]:
    """Build like ``build_generated`` unless ``out`` already holds exactly that dataset.

    Safe for concurrent callers on one machine: each builds in its own temp dir; the first rename
    wins and the others discard their copy and use the winner's.
    """
    _check_counts(num_train=num_train, num_test=num_test, blanks=blanks, seed=seed, num_aug=num_aug)
    out_p = Path(out)
    source = _generated_source(num_train, num_test, blanks, seed, num_aug)
    found = _existing(out_p, source)
    if found is not None:
        return found
    summary, won = _build_atomically(out_p, lambda tmp: _write_generated(tmp, source), replace=False)
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
            summary = build_from_csv(args.out, args.train_csv, args.test_csv, subsample=args.subsample,
                                     num_aug=args.num_aug, seed=args.seed, min_rating=args.min_rating)
        else:
            summary = build_generated(args.out, args.num_train, args.num_test, args.blanks, args.seed,
                                      num_aug=args.num_aug)
    except DatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
