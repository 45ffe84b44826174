"""A dataset directory built by the TRM reference's own builder is read as it is, trains and evaluates; a directory of
neither layout is refused in one line naming what it holds. The fixture and how it was made: tests/reference_dataset/."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from contracts.hydra_app import TrainJob, compose_train_config
from contracts.metrics_log import read_metrics
from trm.checkpoints import checkpoint
from trm.data import DatasetError, build_from_csv, load_split, read_meta, validate_pairs, write_split
from trm.data.format import ARRAY_NAMES
from trm.train import run

HERE = Path(__file__).parent / "reference_dataset"
BUILT = HERE / "sudoku-extreme-3-aug-2"  # the reference's build_sudoku_dataset.py --subsample-size 3 --num-aug 2
# The keys the reference's PuzzleDatasetMetadata writes: the fixture is the reference's output, not ours.
REFERENCE_META_KEYS = {
    "pad_id",
    "ignore_label_id",
    "blank_identifier_id",
    "vocab_size",
    "seq_len",
    "num_puzzle_identifiers",
    "total_groups",
    "mean_puzzle_examples",
    "total_puzzles",
    "sets",
}


def pairs(arrays: dict[str, np.ndarray]) -> set[bytes]:
    """Each example's (input, label) as one hashable value."""
    both = np.concatenate([np.asarray(arrays["inputs"]), np.asarray(arrays["labels"])], axis=1).astype(np.int32)
    return {row.tobytes() for row in both}


def test_the_fixture_is_the_reference_layout_not_ours() -> None:
    for split in ("train", "test"):
        assert set(json.loads((BUILT / split / "dataset.json").read_text())) == REFERENCE_META_KEYS
        assert sorted(p.name for p in (BUILT / split).glob("*.npy")) == sorted(f"all__{n}.npy" for n in ARRAY_NAMES)
    assert json.loads((BUILT / "identifiers.json").read_text()) == ["<blank>"]


def test_a_reference_split_loads_with_counts_metadata_and_the_same_fingerprint_rule(tmp_path: Path) -> None:
    train, train_meta = load_split(BUILT, "train")
    assert train_meta.counts == {"examples": 9, "puzzles": 9, "groups": 3}  # the reference's total_puzzles says 3
    assert train_meta.source == {"layout": "trm-reference", "sets": ["all"], "total_puzzles": 3}
    assert train_meta.arch_fields() == {"vocab_size": 11, "seq_len": 81, "num_puzzle_identifiers": 1}
    assert train["inputs"].dtype == np.int64  # read as the builder wrote it; the loader casts per batch
    test, test_meta = load_split(BUILT, "test", verify=True)
    assert test_meta.counts == {"examples": 3, "puzzles": 3, "groups": 3} and test["inputs"].dtype == np.uint8
    assert read_meta(BUILT, "train") == train_meta
    # The same arrays written in this project's layout have the same fingerprint: a run records the same data
    # identity whichever layout it read, so a checkpoint resumes across them.
    for split, arrays, meta in (("train", train, train_meta), ("test", test, test_meta)):
        ours = write_split(tmp_path, split, arrays, source={})
        assert ours.fingerprint == meta.fingerprint
        again, _ = load_split(tmp_path, split, verify=True)
        assert all(np.array_equal(again[n], arrays[n]) for n in ARRAY_NAMES)
    assert train_meta.fingerprint != test_meta.fingerprint


def test_the_reference_arrays_mean_what_ours_do(tmp_path: Path) -> None:
    """Our CSV build of the same CSVs gives the reference's test split exactly; every reference train example is a
    valid (puzzle, solution) pair in our token encoding, and each group starts with an unaugmented CSV row."""
    build_from_csv(tmp_path / "ours", HERE / "csv" / "train.csv", HERE / "csv" / "test.csv")
    ours_test, ours_test_meta = load_split(tmp_path / "ours", "test")
    ref_test, ref_test_meta = load_split(BUILT, "test")
    assert all(np.array_equal(ours_test[n], ref_test[n]) for n in ARRAY_NAMES)
    assert ours_test_meta.fingerprint == ref_test_meta.fingerprint
    ref_train, _ = load_split(BUILT, "train")
    validate_pairs(np.asarray(ref_train["inputs"]) - 1, np.asarray(ref_train["labels"]) - 1, "reference train")
    ours_train, _ = load_split(tmp_path / "ours", "train")  # all 6 CSV rows, unaugmented
    firsts = {k: np.asarray(v)[ref_train["group_indices"][:-1]] for k, v in ref_train.items() if k != "group_indices"}
    assert pairs(firsts) <= pairs(ours_train) and len(pairs(firsts)) == 3
    assert len(pairs(ref_train) - pairs(ours_train)) == 6  # the augmentations are new examples


@pytest.mark.slow
def test_training_on_the_reference_built_directory_trains_and_evaluates(tmp_path: Path) -> None:
    arch = ["arch.hidden_size=16", "arch.num_heads=2", "arch.L_layers=1", "arch.H_cycles=2", "arch.L_cycles=1"]
    cfg = compose_train_config(
        ["data=sudoku_extreme", f"data.path={BUILT}", f"out_dir={tmp_path}", *arch, "arch.halt_max_steps=3"]
        + ["train.steps=2", "train.eval_interval=2", "train.log_interval=1", "train.global_batch_size=4"]
        + ["train.eval_batch_size=2", "train.eval_examples=null", "train.precision=fp32", "train.progress=false"]
    )
    summary = run(TrainJob.of(cfg))
    assert summary.outcome == "COMPLETE" and summary.steps == 2
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records if "train/lm_loss" in r] == [1, 2]
    (evaluated,) = [r for r in records if "eval/exact_accuracy" in r]
    assert evaluated["step"] == 2 and evaluated["eval/halted_examples"] == 3  # the whole test split, once
    saved = checkpoint.load(str(tmp_path / "checkpoints"))
    assert saved["step"] == 2 and saved["identity"]["data"] == load_split(BUILT, "train")[1].fingerprint


def test_a_directory_of_neither_layout_is_one_line_naming_what_it_holds(tmp_path: Path) -> None:
    (tmp_path / "d" / "train").mkdir(parents=True)
    for name in ("notes.txt", "inputs.bin", "dataset.json"):
        (tmp_path / "d" / "train" / name).write_text("{}")
    with pytest.raises(DatasetError) as e:
        load_split(tmp_path / "d", "train")
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{tmp_path / 'd' / 'train'}: neither dataset layout")
    assert "found dataset.json, inputs.bin, notes.txt;" in message
    assert "inputs.npy" in message and "all__inputs.npy" in message  # what is accepted
    # Pointed at a split instead of the dataset: the missing split's message names what the directory holds.
    with pytest.raises(DatasetError) as e:
        load_split(BUILT / "train", "train")
    message = str(e.value)
    assert "\n" not in message and f"{BUILT / 'train' / 'train'} does not exist" in message
    assert f"({BUILT / 'train'} holds all__group_indices.npy, all__inputs.npy," in message
    (tmp_path / "e" / "test").mkdir(parents=True)
    with pytest.raises(DatasetError, match="found nothing \\(empty directory\\)"):
        load_split(tmp_path / "e", "test")


def test_a_split_holding_both_layouts_is_refused_naming_both(tmp_path: Path) -> None:
    shutil.copytree(BUILT, tmp_path / "d")
    np.save(tmp_path / "d" / "test" / "inputs.npy", np.zeros((1, 81), np.int32))
    with pytest.raises(DatasetError, match="both dataset layouts: found all__group_indices.npy, .*inputs.npy"):
        load_split(tmp_path / "d", "test")


def _edit_meta(split_dir: Path, **changes: object) -> None:
    meta = json.loads((split_dir / "dataset.json").read_text())
    for key, value in changes.items():
        if value is _DROP:
            del meta[key]
        else:
            meta[key] = value
    (split_dir / "dataset.json").write_text(json.dumps(meta))


_DROP = object()


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"total_groups": _DROP},
            r"dataset.json: the TRM reference's layout, but its dataset.json lacks \['total_groups'\]",
        ),
        ({"sets": ["all", "extra"]}, r"dataset.json: sets=\['all', 'extra'\]; only a single set is read"),
        ({"ignore_label_id": None}, r"dataset.json: pad_id=0, ignore_label_id=None; the loader reads pad 0 and ignore"),
        ({"total_groups": 4}, r"train: arrays give 3 groups, dataset.json's total_groups 4"),
    ],
)
def test_a_malformed_reference_split_names_the_file_and_what_is_wrong(
    tmp_path: Path, changes: dict[str, object], expected: str
) -> None:
    shutil.copytree(BUILT, tmp_path / "d")
    _edit_meta(tmp_path / "d" / "train", **changes)
    with pytest.raises(DatasetError, match=expected) as e:
        load_split(tmp_path / "d", "train")
    assert str(tmp_path / "d" / "train") in str(e.value)


def test_bad_reference_arrays_are_refused_naming_the_file(tmp_path: Path) -> None:
    shutil.copytree(BUILT, tmp_path / "d")
    split = tmp_path / "d" / "test"
    (split / "all__labels.npy").unlink()
    with pytest.raises(DatasetError, match=f"{split / 'all__labels.npy'} does not exist"):
        load_split(tmp_path / "d", "test")
    np.save(split / "all__labels.npy", np.full((3, 81), 11, np.uint8))  # a token past the vocabulary
    with pytest.raises(DatasetError, match=f"{split}: labels must hold tokens in \\[0, 11\\), got \\[11, 11\\]"):
        load_split(tmp_path / "d", "test")
