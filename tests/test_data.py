"""Tests for trm.data: generator, augmentation, CSV reading, on-disk format, builder, loaders, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from trm.data import (
    DatasetError,
    augment,
    build_from_csv,
    build_generated,
    ensure_generated,
    fingerprint,
    generate,
    load_split,
    read_csv,
    solve,
    solve_count,
    validate_pairs,
)
from trm.data.format import ARRAY_NAMES
from trm.data.loader import IGNORE_INDEX, TrainLoader, eval_batches

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def small_set() -> tuple[np.ndarray, np.ndarray]:
    return generate(24, 45, seed=7)


# ---------------------------------------------------------------------------------- generator


def test_generate_unique_solutions_with_exact_blanks(small_set):
    puzzles, solutions = small_set
    assert puzzles.shape == solutions.shape == (24, 81) and puzzles.dtype == np.uint8
    assert ((puzzles == 0).sum(axis=1) == 45).all()
    validate_pairs(puzzles, solutions, "generated")
    for p, s in zip(puzzles, solutions):
        found = solve(p, limit=2)
        assert len(found) == 1 and np.array_equal(found[0], s)
    assert len({p.tobytes() for p in puzzles}) == 24


def test_generate_is_deterministic_and_seed_dependent(small_set):
    again = generate(24, 45, seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(small_set, again))
    other, _ = generate(24, 45, seed=8)
    assert not np.array_equal(other, small_set[0])


def test_generate_excludes_given_puzzles():
    first, _ = generate(3, 30, seed=1)
    rest, _ = generate(3, 30, seed=1, exclude={first[0].tobytes()})
    assert first[0].tobytes() not in {p.tobytes() for p in rest}


@pytest.mark.parametrize("blanks", [-1, 65, 81])
def test_generate_rejects_infeasible_blanks(blanks):
    with pytest.raises(DatasetError, match="blanks"):
        generate(1, blanks, seed=0)


def test_solver_counts():
    assert solve_count(np.zeros(81, dtype=np.uint8)) == 2  # empty grid: many solutions
    bad = np.zeros(81, dtype=np.uint8)
    bad[0] = bad[1] = 5  # clash in row 0
    assert solve_count(bad) == 0


# ------------------------------------------------------------------------------- augmentation


def test_augment_keeps_valid_pairs_and_changes_them(small_set):
    puzzles, solutions = small_set
    k = 30
    ap, as_, groups = augment(puzzles, solutions, k, np.random.default_rng(0))
    assert ap.shape == as_.shape == (24 * (k + 1), 81)
    assert np.array_equal(groups, np.repeat(np.arange(24), k + 1))
    assert np.array_equal(ap[:: k + 1], puzzles) and np.array_equal(as_[:: k + 1], solutions)
    validate_pairs(ap, as_, "augmented")  # valid grids, givens agree with solutions
    assert ((ap == 0).sum(axis=1) == 45).all()
    for i in range(0, ap.shape[0], 7):  # still a unique-solution puzzle, and it's the transformed solution
        found = solve(ap[i], limit=2)
        assert len(found) == 1 and np.array_equal(found[0], as_[i])
    orig_rows = np.repeat(np.arange(24), k + 1) * (k + 1)
    aug = np.ones(ap.shape[0], dtype=bool)
    aug[:: k + 1] = False
    assert (ap[aug] != ap[orig_rows[aug]]).any(axis=1).all()  # never the identity
    assert ((ap[aug] == 0) != (ap[orig_rows[aug]] == 0)).any(axis=1).mean() > 0.9  # cells move
    assert len({r.tobytes() for r in as_}) == as_.shape[0]  # all copies distinct
    again = augment(puzzles, solutions, k, np.random.default_rng(0))
    assert np.array_equal(again[0], ap) and np.array_equal(again[1], as_)


def test_validate_pairs_names_first_bad_row(small_set):
    puzzles, solutions = small_set[0].copy(), small_set[1].copy()
    solutions[5, [0, 1]] = solutions[5, [1, 0]]  # swap two cells: breaks a column
    with pytest.raises(DatasetError, match=r"where-x, row 5"):
        validate_pairs(puzzles, solutions, "where-x")


# ------------------------------------------------------------------------------- format/build


def test_build_generated_is_deterministic(tmp_path):
    a = build_generated(tmp_path / "a", 12, 5, 40, seed=3, num_aug=4)
    b = build_generated(tmp_path / "b", 12, 5, 40, seed=3, num_aug=4)
    c = build_generated(tmp_path / "c", 12, 5, 40, seed=4, num_aug=4)
    for split in ("train", "test"):
        assert a[split]["fingerprint"] == b[split]["fingerprint"] != c[split]["fingerprint"]
        for name in ARRAY_NAMES:
            fa = (tmp_path / "a" / split / f"{name}.npy").read_bytes()
            assert fa == (tmp_path / "b" / split / f"{name}.npy").read_bytes()
    assert a["train"] == {"examples": 60, "groups": 12, "fingerprint": a["train"]["fingerprint"]}
    assert a["test"]["examples"] == 5 and a["test"]["groups"] == 5


def test_split_contents_and_metadata(tmp_path):
    build_generated(tmp_path / "d", 6, 4, 35, seed=0, num_aug=2)
    arrays, meta = load_split(tmp_path / "d", "train", verify=True)
    raw = json.loads((tmp_path / "d" / "train" / "dataset.json").read_text())
    assert {
        k: raw[k] for k in ("vocab_size", "seq_len", "pad_id", "ignore_label_id", "blank_id", "num_puzzle_identifiers")
    } == {
        "vocab_size": 11,
        "seq_len": 81,
        "pad_id": 0,
        "ignore_label_id": 0,
        "blank_id": 1,
        "num_puzzle_identifiers": 1,
    }
    assert raw["counts"] == {"examples": 18, "puzzles": 18, "groups": 6}
    assert raw["source"]["blanks"] == 35 and raw["fingerprint"] == meta.fingerprint == fingerprint(arrays)
    assert all(arrays[n].dtype == np.int32 for n in ARRAY_NAMES)
    assert np.array_equal(arrays["puzzle_indices"], np.arange(19))
    assert np.array_equal(arrays["group_indices"], np.arange(0, 19, 3))
    assert not arrays["puzzle_identifiers"].any()
    inputs, labels = np.asarray(arrays["inputs"]), np.asarray(arrays["labels"])
    assert inputs.min() == 1 and inputs.max() <= 10 and labels.min() == 2 and labels.max() == 10
    assert ((inputs == 1).sum(axis=1) == 35).all()
    validate_pairs(inputs - 1, labels - 1, "train split")
    test_arrays, _ = load_split(tmp_path / "d", "test")
    train_set = {r.tobytes() for r in inputs}
    assert not any(r.tobytes() in train_set for r in np.asarray(test_arrays["inputs"]))


def test_fingerprint_depends_on_values_not_input_dtype(tmp_path):
    build_generated(tmp_path / "d", 3, 1, 30, seed=0)
    arrays, meta = load_split(tmp_path / "d", "test", mmap=False)
    as_u8 = dict(arrays, inputs=arrays["inputs"].astype(np.uint8))
    assert fingerprint(as_u8) == meta.fingerprint
    changed = dict(arrays, inputs=arrays["inputs"].copy())
    changed["inputs"][0, 0] ^= 3
    assert fingerprint(changed) != meta.fingerprint


def test_missing_dataset_names_path_and_build_command(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(DatasetError) as e:
        load_split(missing, "train")
    assert str(missing) in str(e.value) and "python -m trm.data.build" in str(e.value)
    build_generated(tmp_path / "d", 2, 1, 30, seed=0)
    (tmp_path / "d" / "test" / "labels.npy").unlink()
    with pytest.raises(DatasetError, match="labels.npy"):
        load_split(tmp_path / "d", "test")


def test_ensure_generated_reuses_races_and_rejects_other_args(tmp_path):
    out = tmp_path / "ds"
    with ThreadPoolExecutor(4) as pool:  # concurrent first builds: one wins, all agree
        results = list(pool.map(lambda _: ensure_generated(out, 8, 3, 30, seed=1, num_aug=2), range(4)))
    assert all(r == results[0] for r in results)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # no temp dirs left behind
    mtime = (out / "train" / "inputs.npy").stat().st_mtime_ns
    assert ensure_generated(out, 8, 3, 30, seed=1, num_aug=2) == results[0]
    assert (out / "train" / "inputs.npy").stat().st_mtime_ns == mtime  # not rebuilt
    with pytest.raises(DatasetError) as e:
        ensure_generated(out, 8, 3, 31, seed=1, num_aug=2)
    assert str(out) in str(e.value) and "blanks" in str(e.value)


def test_build_refuses_to_replace_non_dataset_dir(tmp_path):
    (tmp_path / "keep.txt").write_text("user data")
    with pytest.raises(DatasetError, match="refusing"):
        build_generated(tmp_path, 2, 1, 30, seed=0)
    assert (tmp_path / "keep.txt").read_text() == "user data"


# ---------------------------------------------------------------------------------------- CSV


def _write_csv(path: Path, rows: list[list[str]]) -> Path:
    path.write_text("source,question,answer,rating\n" + "".join(",".join(r) + "\n" for r in rows))
    return path


def _csv_rows(puzzles: np.ndarray, solutions: np.ndarray) -> list[list[str]]:
    rows = []
    for i, (p, s) in enumerate(zip(puzzles, solutions)):
        q = "".join(map(str, p)).replace("0", "." if i % 2 else "0")  # both blank spellings
        rows.append([f"src{i}", q, "".join(map(str, s)), str(i)])
    return rows


def test_read_csv_round_trip_filter_and_subsample(tmp_path, small_set):
    puzzles, solutions = small_set[0][:10], small_set[1][:10]
    path = _write_csv(tmp_path / "train.csv", _csv_rows(puzzles, solutions))
    p, s = read_csv(path)
    assert np.array_equal(p, puzzles) and np.array_equal(s, solutions)
    p, s = read_csv(path, min_rating=4)  # ratings are 0..9
    assert np.array_equal(p, puzzles[4:]) and np.array_equal(s, solutions[4:])
    p1, s1 = read_csv(path, min_rating=4, subsample=3, seed=5)
    p2, _ = read_csv(path, min_rating=4, subsample=3, seed=5)
    p3, _ = read_csv(path, min_rating=4, subsample=3, seed=6)
    assert p1.shape == (3, 81) and np.array_equal(p1, p2) and not np.array_equal(p1, p3)
    idx = [int(np.flatnonzero((puzzles == r).all(axis=1))[0]) for r in p1]
    assert all(i >= 4 for i in idx) and idx == sorted(idx) and np.array_equal(s1, solutions[idx])
    assert read_csv(path, subsample=50)[0].shape == (10, 81)


def test_build_from_csv(tmp_path, small_set):
    puzzles, solutions = small_set
    train = _write_csv(tmp_path / "train.csv", _csv_rows(puzzles[:16], solutions[:16]))
    test = _write_csv(tmp_path / "test.csv", _csv_rows(puzzles[16:], solutions[16:]))
    summary = build_from_csv(tmp_path / "ds", train, test, subsample=6, num_aug=3, seed=0, min_rating=2)
    assert summary["train"]["examples"] == 24 and summary["train"]["groups"] == 6
    assert summary["test"]["examples"] == 6  # ratings 2..7 of 8 test rows; no subsample/augment on test
    arrays, meta = load_split(tmp_path / "ds", "test")
    assert np.array_equal(np.asarray(arrays["inputs"]) - 1, puzzles[18:])
    assert meta.source["kind"] == "csv" and meta.source["subsample"] == 6
    tr, _ = load_split(tmp_path / "ds", "train")
    validate_pairs(np.asarray(tr["inputs"]) - 1, np.asarray(tr["labels"]) - 1, "csv train")
    again = build_from_csv(tmp_path / "ds2", train, test, subsample=6, num_aug=3, seed=0, min_rating=2)
    assert again["train"]["fingerprint"] == summary["train"]["fingerprint"]


@pytest.mark.parametrize(
    "corrupt, expected",
    [
        (lambda r: r.__setitem__(1, r[1][:80]), "80 cells"),
        (lambda r: r.__setitem__(1, "x" + r[1][1:]), "bad character 'x'"),
        (lambda r: r.__setitem__(2, r[2][:40] + "a" + r[2][41:]), "bad character 'a'"),
        (lambda r: r.pop(0), "expected 4 columns"),
        (lambda r: r.__setitem__(3, "hard"), "'hard'"),
        (lambda r: r.__setitem__(3, "-3"), "rating must be an integer >= 0, got '-3'"),  # issue 57.5
        (lambda r: r.__setitem__(0, "book\x00one"), "source has a control character (a NUL byte?): 'book\\x00one'"),
        (lambda r: r.__setitem__(2, r[2][1] + r[2][0] + r[2][2:]), "solution"),
    ],
)
def test_bad_csv_rows_name_file_and_line(tmp_path, small_set, corrupt, expected):
    rows = _csv_rows(small_set[0][:4], small_set[1][:4])
    rows[1] = rows[1][:1] + ["".join(map(str, small_set[1][1]))] * 2 + ["1"]  # row 1: no blanks, so the
    corrupt(rows[1])  # answer swap breaks a grid
    path = _write_csv(tmp_path / "broken.csv", rows)
    with pytest.raises(DatasetError) as e:
        read_csv(path)
    msg = str(e.value)
    assert str(path) in msg and "line 3" in msg and expected in msg, msg


def test_bad_csv_header(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("a,b,c,d\n")
    with pytest.raises(DatasetError, match=r"h\.csv, line 1"):
        read_csv(path)


# ------------------------------------------------------------------------------------- loader


def _synthetic(n: int) -> dict[str, np.ndarray]:
    """Rows identifiable by inputs[:, 0] == index; some labels equal the ignore id 0."""
    inputs = np.ones((n, 81), dtype=np.int32)
    inputs[:, 0] = np.arange(n)
    labels = np.full((n, 81), 5, dtype=np.int32)
    labels[:, 3] = 0
    return {
        "inputs": inputs,
        "labels": labels,
        "puzzle_identifiers": np.zeros(n, dtype=np.int32),
        "puzzle_indices": np.arange(n + 1, dtype=np.int32),
        "group_indices": np.arange(n + 1, dtype=np.int32),
    }


def test_train_loader_rejects_bad_batch_sizes():
    with pytest.raises(DatasetError, match="global_batch_size=10.*world_size=4"):
        TrainLoader(_synthetic(50), 10, rank=0, world_size=4, seed=0)
    big = TrainLoader(_synthetic(50), 64, rank=0, world_size=1, seed=0)  # spans epochs, as the reference's stream
    drawn = next(big)["inputs"][:, 0].tolist()
    assert sorted(drawn[:50]) == list(range(50)) and len(set(drawn[50:])) == 14  # epoch 0 whole, then epoch 1


@pytest.mark.parametrize("world", [2, 4])
def test_rank_shards_concatenate_to_single_rank_batch(world):
    arrays = _synthetic(50)  # epochs of 50 examples, batches of 8: 14 steps cross two epoch boundaries
    single = TrainLoader(arrays, 8, rank=0, world_size=1, seed=11)
    ranks = [TrainLoader(arrays, 8, rank=r, world_size=world, seed=11) for r in range(world)]
    stream: list[int] = []
    for _ in range(14):
        want = next(single)
        parts = [next(loader) for loader in ranks]
        assert all(p["inputs"].shape == (8 // world, 81) and p["inputs"].dtype == torch.long for p in parts)
        for key in ("inputs", "labels", "puzzle_identifiers"):
            assert torch.equal(torch.cat([p[key] for p in parts]), want[key])
        stream.extend(want["inputs"][:, 0].tolist())
    epoch0, epoch1 = stream[:50], stream[50:100]
    assert sorted(epoch0) == sorted(epoch1) == list(range(50))  # every example once per epoch, none dropped
    assert epoch0 != epoch1  # reshuffled every epoch
    assert (want["labels"][:, 3] == IGNORE_INDEX).all() and (want["labels"][:, 4] == 5).all()


def test_an_epoch_draws_one_member_of_each_group():
    """The reference's epoch: one random augmentation of each original puzzle (groups of 4 here)."""
    arrays = _synthetic(40)
    arrays["group_indices"] = np.arange(0, 41, 4, dtype=np.int32)  # 10 puzzles x 4 augmentations
    loader = TrainLoader(arrays, 5, rank=0, world_size=1, seed=2)
    members_seen: set[int] = set()
    for epoch in range(8):
        drawn = [int(i) for b in (next(loader), next(loader)) for i in b["inputs"][:, 0]]
        assert sorted(i // 4 for i in drawn) == list(range(10)), f"epoch {epoch}: one member per group"
        members_seen.update(drawn)
    assert loader.epoch == 8.0
    assert len(members_seen) > 20  # different augmentations are drawn from epoch to epoch


def test_train_loader_resume_matches_uninterrupted():
    arrays = _synthetic(50)
    ref = TrainLoader(arrays, 8, rank=1, world_size=2, seed=3)
    ref_batches = [next(ref) for _ in range(15)]
    first = TrainLoader(arrays, 8, rank=1, world_size=2, seed=3)
    for _ in range(8):
        next(first)
    state = first.state_dict()
    assert state == {"batches": 8}
    resumed = TrainLoader(arrays, 8, rank=1, world_size=2, seed=3)
    resumed.load_state_dict(state)
    for want in ref_batches[8:]:
        got = next(resumed)
        assert all(torch.equal(got[k], want[k]) for k in want)
    other_seed = TrainLoader(arrays, 8, rank=1, world_size=2, seed=4)
    assert not torch.equal(next(other_seed)["inputs"], ref_batches[0]["inputs"])
    with pytest.raises(DatasetError, match="batches"):
        resumed.load_state_dict({"epoch": 1, "position": 2})  # the old loader's state names the problem


@pytest.mark.parametrize("world, bs, max_examples", [(1, 4, None), (2, 3, None), (3, 4, 17), (4, 5, 6), (4, 2, 0)])
def test_eval_shards_cover_each_example_once(world, bs, max_examples):
    arrays = _synthetic(23)
    n = 23 if max_examples is None else min(23, max_examples)
    seen: list[int] = []
    lengths = set()
    for rank in range(world):
        batches = list(eval_batches(arrays, bs, rank, world, max_examples=max_examples))
        lengths.add(len(batches))
        for b in batches:
            assert b["inputs"].shape == (bs, 81) and b["valid"].shape == (bs,) and b["valid"].dtype == torch.bool
            seen += b["inputs"][b["valid"], 0].tolist()
            assert (b["labels"][~b["valid"]] == IGNORE_INDEX).all()
            assert (b["labels"][b["valid"], 3] == IGNORE_INDEX).all()
    assert len(lengths) == 1  # same number of batches on every rank
    assert sorted(seen) == list(range(n))


# ---------------------------------------------------------------------------------------- CLI


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-m", "trm.data.build", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_cli_prints_one_json_line(tmp_path):
    out = tmp_path / "cli"
    proc = _run_cli(
        "--source",
        "generate",
        "--num-train",
        "6",
        "--num-test",
        "2",
        "--blanks",
        "40",
        "--seed",
        "5",
        "--num-aug",
        "2",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    summary = json.loads(lines[0])
    assert summary["train"]["examples"] == 18 and summary["test"]["groups"] == 2
    in_process = build_generated(tmp_path / "api", 6, 2, 40, seed=5, num_aug=2)
    assert summary["train"]["fingerprint"] == in_process["train"]["fingerprint"]
    assert Path(summary["out"]) == out


@pytest.mark.slow
def test_cli_reports_bad_input(tmp_path):
    bad = _write_csv(tmp_path / "bad.csv", [["s", "1" * 80, "1" * 81, "0"]])
    proc = _run_cli("--source", "csv", "--train-csv", str(bad), "--test-csv", str(bad), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert "bad.csv, line 2" in proc.stderr
    proc = _run_cli("--source", "generate", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "--num-train" in proc.stderr


# ---------------------------------------------------------------------------------- build faults


def test_a_csv_with_a_utf8_byte_order_mark_is_read(tmp_path, small_set):
    """A spreadsheet's "CSV UTF-8" export starts with a BOM; the header must still be recognised."""
    puzzles, solutions = small_set[0][:4], small_set[1][:4]
    plain = _write_csv(tmp_path / "plain.csv", _csv_rows(puzzles, solutions))
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    p, s = read_csv(bom)
    assert np.array_equal(p, puzzles) and np.array_equal(s, solutions)
    test = _write_csv(tmp_path / "test.csv", _csv_rows(small_set[0][4:6], small_set[1][4:6]))
    summary = build_from_csv(tmp_path / "ds", bom, test)
    assert summary["train"]["examples"] == 4


@pytest.mark.slow
def test_an_empty_split_is_refused_at_build_time_naming_the_file_or_flag(tmp_path, small_set):
    rows = _csv_rows(small_set[0][:6], small_set[1][:6])
    train = _write_csv(tmp_path / "train.csv", rows[:4])
    test = _write_csv(tmp_path / "test.csv", rows[4:])
    header_only = _write_csv(tmp_path / "header_only.csv", [])
    for args, named in (
        (("--train-csv", str(header_only), "--test-csv", str(test)), ["header_only.csv", "train split", "--train-csv"]),
        (("--train-csv", str(train), "--test-csv", str(header_only)), ["header_only.csv", "test split", "--test-csv"]),
        (("--train-csv", str(train), "--test-csv", str(test), "--subsample", "0"), ["--subsample 0", "empty"]),
        (
            ("--train-csv", str(train), "--test-csv", str(test), "--min-rating", "50"),
            ["train.csv", "rating >= 50", "--min-rating"],
        ),
    ):
        out = tmp_path / "ds"
        proc = _run_cli("--source", "csv", *args, "--out", str(out))
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert proc.stderr.startswith("error: ") and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert all(n in proc.stderr for n in named), (named, proc.stderr)
        assert not out.exists() and sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    with pytest.raises(DatasetError, match=r"num_test=0 \(--num-test, data.num_test\).*empty test split"):
        build_generated(tmp_path / "gen", 4, 0, 30, seed=0)
    with pytest.raises(DatasetError, match=r"num_train=0 .*empty train split"):
        ensure_generated(tmp_path / "gen", 0, 2, 30, seed=0)


@pytest.mark.slow
def test_a_subsample_larger_than_the_file_is_refused_naming_both_numbers(tmp_path, small_set):
    rows = _csv_rows(small_set[0][:8], small_set[1][:8])
    train = _write_csv(tmp_path / "train.csv", rows[:5])
    test = _write_csv(tmp_path / "test.csv", rows[5:])
    proc = _run_cli(
        "--source",
        "csv",
        "--train-csv",
        str(train),
        "--test-csv",
        str(test),
        "--subsample",
        "7",
        "--out",
        str(tmp_path / "ds"),
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert "--subsample 7" in proc.stderr and "train.csv has (5)" in proc.stderr and "at most 5" in proc.stderr
    assert not (tmp_path / "ds").exists()
    with pytest.raises(DatasetError, match=r"--subsample 4 .* \(3 with rating >= 2 \(--min-rating\)\)"):
        build_from_csv(tmp_path / "ds", train, test, subsample=4, min_rating=2)  # ratings 0..4: three are >= 2
    assert build_from_csv(tmp_path / "ds", train, test, subsample=5)["train"]["examples"] == 5  # all of them is fine


@pytest.mark.slow
def test_the_same_csv_for_train_and_test_is_refused_unless_overlap_is_allowed(tmp_path, small_set):
    """The same file twice is named; as every test puzzle is then a train puzzle, the build is refused unless
    --allow-overlap (overlap is refused: tests/test_data_leaks.py)."""
    rows = _csv_rows(small_set[0][:6], small_set[1][:6])
    both = _write_csv(tmp_path / "both.csv", rows)
    (tmp_path / "link.csv").symlink_to(both)  # the same file under another name is still the same file
    args = ["--source", "csv", "--train-csv", str(both), "--test-csv", str(tmp_path / "link.csv")]
    proc = _run_cli(*args, "--out", str(tmp_path / "ds"))
    assert proc.returncode == 2 and "6 of 6 test puzzles" in proc.stderr, proc.stderr
    proc = _run_cli(*args, "--out", str(tmp_path / "ds"), "--allow-overlap")
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2 and "same file" in warnings[0] and str(both) in warnings[0], proc.stderr
    assert "built anyway (--allow-overlap)" in warnings[1]
    assert json.loads(proc.stdout)["test"]["examples"] == 6  # still built: evaluating on train can be on purpose


def _wait_for(predicate, what: str, proc: subprocess.Popen | None = None, timeout: float = 120.0):
    import time

    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        assert proc is None or proc.poll() is None, f"{what}: the process ended ({proc.returncode})"
        time.sleep(0.05)
    return found


@pytest.mark.slow
def test_a_killed_build_leaves_temp_dirs_the_next_build_removes_but_never_a_running_builds(tmp_path):
    """SIGKILL mid-build used to leave `.<out>.tmp-*` (100-200 MB on real data) forever. The next build removes
    a killed build's leftovers (its flock is free) and keeps those of a build that is still running."""
    import signal
    import time

    out = tmp_path / "ds"
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def builder(num_train: int) -> subprocess.Popen:  # generation is ~200 puzzles/s: this takes seconds
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trm.data.build",
                "--source",
                "generate",
                "--num-train",
                str(num_train),
                "--num-test",
                "2",
                "--blanks",
                "50",
                "--seed",
                "1",
                "--out",
                str(out),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def temp_dirs() -> set[Path]:
        return set(tmp_path.glob(".ds.tmp-*"))

    killed = builder(100_000)
    (stale,) = _wait_for(temp_dirs, "the first build's temp dir", killed)
    (stale / "train").mkdir()  # as if it had written part of a split
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=30)
    assert stale.is_dir()  # what the kill leaves behind (and its free lock file, .ds.build-<token>.lock)
    stale_lock = tmp_path / f".ds.build-{stale.name.split('.tmp-')[1]}.lock"

    running = builder(1500)
    (live,) = _wait_for(lambda: temp_dirs() - {stale}, "the running build's temp dir", running)
    # Leftovers of an older version's build (no lock file): removed only when the pid is gone and it is old.
    probe = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(probe.stdout)  # a process that has exited
    old_dead = tmp_path / f".ds.tmp-{dead_pid}-0badc0de"
    young_dead = tmp_path / f".ds.old-{dead_pid}-00c0ffee"
    old_alive = tmp_path / f".ds.tmp-{os.getpid()}-0000beef"
    for d in (old_dead, young_dead, old_alive):
        (d / "train").mkdir(parents=True)
    two_hours_ago = time.time() - 7200
    for d in (old_dead, old_alive):
        os.utime(d, (two_hours_ago, two_hours_ago))
    other = tmp_path / ".other.tmp-1-deadbeef"  # another dataset's: not this build's business
    other.mkdir()

    build_generated(out, 4, 2, 30, seed=0)  # the next build, while `running` is still building

    assert running.poll() is None, "the test needs the second build still running here"
    assert not stale.exists() and not stale_lock.exists() and not old_dead.exists()
    assert live.is_dir() and young_dead.is_dir() and old_alive.is_dir() and other.is_dir()
    _, err = running.communicate(timeout=300)
    assert running.returncode == 0, err  # its temp dir was never touched: it completed and renamed into place
    _, meta = load_split(out, "train")
    assert meta.source["num_train"] == 1500
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".ds."))
    assert left == sorted(p.name for p in (young_dead, old_alive)), left
