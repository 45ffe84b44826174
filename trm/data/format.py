"""On-disk dataset format shared by real (Sudoku-Extreme CSV) and generated data.

A dataset directory holds ``train/`` and ``test/``; each split holds ``dataset.json`` plus
int32 ``.npy`` arrays (see ``ARRAY_NAMES``). Keeping one format means the trainer never needs
to know where the data came from, and the fingerprint lets runs record exactly what they saw.

A split built by the TRM reference's ``dataset/build_sudoku_dataset.py`` (TinyRecursiveModels e7b6871) is read as it
is: the same arrays as ``<set>__<name>.npy`` (inputs/labels uint8 or int64) and its own ``dataset.json`` keys.
``load_split`` tells the layouts apart by their files; it hashes the reference's arrays on load by the same rule, so
the same arrays have the same fingerprint in either layout.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SEQ_LEN = 81
VOCAB_SIZE = 11  # 0 pad, 1 blank, 2..10 digits 1..9
PAD_ID = 0
BLANK_ID = 1
# Label value on disk of a cell the loss must ignore (pad). The loader maps it to trm.losses.IGNORE_INDEX (-100);
# dataset.json records it as `ignore_label_id` (the file format's key, kept).
PAD_LABEL = 0
NUM_PUZZLE_IDENTIFIERS = 1
SPLITS = ("train", "test")
# Fixed order: the fingerprint depends on it.
ARRAY_NAMES = ("inputs", "labels", "puzzle_identifiers", "puzzle_indices", "group_indices")
DISK_DTYPE = np.dtype("<i4")  # explicit little-endian so files and fingerprints match everywhere
_HASH_CHUNK_ROWS = 1 << 16
BUILD_HINT = (
    "build it with `python -m trm.data.build --source generate --num-train N --num-test M "
    "--blanks B --seed S --out {out}` or `python -m trm.data.build --source csv --train-csv A "
    "--test-csv B --out {out}`"
)


# What `load_split` accepts in a split directory, as its errors name it.
LAYOUTS = (
    "this project's (dataset.json with 'counts', inputs.npy, labels.npy, ...) or the TRM reference's "
    "build_sudoku_dataset.py output (dataset.json with 'sets', all__inputs.npy, all__labels.npy, ...)"
)
# The reference's dataset.json keys this reader needs (its PuzzleDatasetMetadata has these and more).
REF_KEYS = ("pad_id", "ignore_label_id", "vocab_size", "seq_len", "num_puzzle_identifiers", "total_groups", "sets")


class DatasetError(ValueError):
    """Any bad input, bad file or inconsistent dataset (one type so callers can catch it)."""


@dataclass(frozen=True)
class SplitMeta:
    """Contents of ``dataset.json`` for one split."""

    counts: dict[str, int]
    fingerprint: str
    source: dict[str, Any] = field(default_factory=dict)
    vocab_size: int = VOCAB_SIZE
    seq_len: int = SEQ_LEN
    pad_id: int = PAD_ID
    ignore_label_id: int = PAD_LABEL  # dataset.json's name for PAD_LABEL
    blank_id: int = BLANK_ID
    num_puzzle_identifiers: int = NUM_PUZZLE_IDENTIFIERS

    @property
    def examples(self) -> int:
        return int(self.counts["examples"])

    @property
    def groups(self) -> int:
        return int(self.counts["groups"])

    def arch_fields(self) -> dict[str, int]:
        """What the model's config takes from the data (TRMConfig.from_dict's dataset fields)."""
        return {
            "vocab_size": self.vocab_size,
            "seq_len": self.seq_len,
            "num_puzzle_identifiers": self.num_puzzle_identifiers,
        }

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        # Stable key order for humans; json.dumps(sort_keys) is used on write anyway.
        return {
            k: d[k]
            for k in (
                "vocab_size",
                "seq_len",
                "pad_id",
                "ignore_label_id",
                "blank_id",
                "num_puzzle_identifiers",
                "counts",
                "fingerprint",
                "source",
            )
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: str) -> SplitMeta:
        try:
            counts = {k: int(d["counts"][k]) for k in ("examples", "puzzles", "groups")}
            return cls(
                counts=counts,
                fingerprint=str(d["fingerprint"]),
                source=dict(d.get("source", {})),
                vocab_size=int(d["vocab_size"]),
                seq_len=int(d["seq_len"]),
                pad_id=int(d["pad_id"]),
                ignore_label_id=int(d["ignore_label_id"]),
                blank_id=int(d["blank_id"]),
                num_puzzle_identifiers=int(d["num_puzzle_identifiers"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise DatasetError(f"{where}: malformed dataset.json ({type(e).__name__}: {e})") from e


def _canonical(a: np.ndarray) -> np.ndarray:
    """int32 little-endian C-contiguous view/copy: the one representation we hash and store."""
    return np.ascontiguousarray(a, dtype=DISK_DTYPE)


def _check_arrays(arrays: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Validate names, shapes and index ranges; return the counts."""
    missing = [n for n in ARRAY_NAMES if n not in arrays]
    extra = [n for n in arrays if n not in ARRAY_NAMES]
    if missing or extra:
        raise DatasetError(f"arrays must be exactly {list(ARRAY_NAMES)}; missing {missing}, unexpected {extra}")
    for name in ARRAY_NAMES:
        if not np.issubdtype(np.asarray(arrays[name]).dtype, np.integer):
            raise DatasetError(f"array {name!r} must be integer, got {arrays[name].dtype}")
    inputs, labels = arrays["inputs"], arrays["labels"]
    if inputs.ndim != 2 or inputs.shape[1] != SEQ_LEN or labels.shape != inputs.shape:
        raise DatasetError(f"inputs/labels must both be [N, {SEQ_LEN}], got {inputs.shape} and {labels.shape}")
    n = inputs.shape[0]
    pid, pidx, gidx = arrays["puzzle_identifiers"], arrays["puzzle_indices"], arrays["group_indices"]
    if pid.shape != (n,):
        raise DatasetError(f"puzzle_identifiers must be [{n}], got {pid.shape}")
    if pidx.ndim != 1 or pidx.shape[0] < 1 or pidx[0] != 0 or pidx[-1] != n or np.any(np.diff(pidx) < 0):
        raise DatasetError(f"puzzle_indices must be non-decreasing from 0 to {n}")
    puzzles = pidx.shape[0] - 1
    if gidx.ndim != 1 or gidx.shape[0] < 1 or gidx[0] != 0 or gidx[-1] != puzzles or np.any(np.diff(gidx) < 0):
        raise DatasetError(f"group_indices must be non-decreasing from 0 to {puzzles}")
    return {"examples": int(n), "puzzles": int(puzzles), "groups": int(gidx.shape[0] - 1)}


def _check_tokens(arrays: Mapping[str, np.ndarray]) -> None:
    for name in ("inputs", "labels"):
        a = arrays[name]
        if a.size and (int(a.min()) < 0 or int(a.max()) >= VOCAB_SIZE):
            raise DatasetError(f"{name} must hold tokens in [0, {VOCAB_SIZE}), got [{a.min()}, {a.max()}]")


def _chunks(a: np.ndarray) -> Iterator[np.ndarray]:
    """Canonical int32 LE pieces of ``a`` in row order (bounded temp memory for uint8 inputs)."""
    for start in range(0, a.shape[0], _HASH_CHUNK_ROWS):
        yield _canonical(a[start : start + _HASH_CHUNK_ROWS])


def _hash_header(h: Any, name: str, a: np.ndarray) -> None:
    h.update(f"{name}|{DISK_DTYPE.str}|{tuple(int(s) for s in a.shape)}\n".encode())


def fingerprint(arrays: Mapping[str, np.ndarray]) -> str:
    """sha256 over the arrays in ``ARRAY_NAMES`` order, each as int32 LE with name/dtype/shape folded in."""
    h = hashlib.sha256()
    for name in ARRAY_NAMES:
        _hash_header(h, name, arrays[name])
        for chunk in _chunks(arrays[name]):
            h.update(chunk.tobytes())
    return h.hexdigest()


def _write_npy(path: Path, name: str, a: np.ndarray, h: Any) -> None:
    """Write ``a`` as an int32 .npy chunk by chunk, feeding the same bytes to the fingerprint."""
    _hash_header(h, name, a)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": DISK_DTYPE.str, "fortran_order": False, "shape": tuple(int(s) for s in a.shape)}
        )
        for chunk in _chunks(a):
            b = chunk.tobytes()
            h.update(b)
            f.write(b)


def write_split(
    out_dir: str | os.PathLike[str], split: str, arrays: Mapping[str, np.ndarray], source: Mapping[str, Any]
) -> SplitMeta:
    """Write ``out_dir/split`` atomically (temp dir, then rename), replacing an existing split."""
    if split not in SPLITS:
        raise DatasetError(f"split must be one of {SPLITS}, got {split!r}")
    counts = _check_arrays(arrays)
    _check_tokens(arrays)  # catches token/digit mix-ups before they are written
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / split
    tmp = out_dir / f".{split}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        h = hashlib.sha256()
        for name in ARRAY_NAMES:
            _write_npy(tmp / f"{name}.npy", name, arrays[name], h)
        meta = SplitMeta(counts=counts, fingerprint=h.hexdigest(), source=dict(source))
        (tmp / "dataset.json").write_text(json.dumps(meta.to_json(), indent=2) + "\n")
        if final.exists():
            old = out_dir / f".{split}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return meta


def _found(d: Path) -> str:
    """What directory ``d`` holds, for an error message: its first names (folders with a trailing /)."""
    names = sorted(p.name + "/" * p.is_dir() for p in d.iterdir())
    more = f" and {len(names) - 10} more" if len(names) > 10 else ""
    return ", ".join(names[:10]) + more if names else "nothing (empty directory)"


def split_layout(data_dir: str | os.PathLike[str], split: str) -> str:
    """``"trm"`` or ``"reference"``, by the files in ``data_dir/split``; else one line naming what is there."""
    data_dir = Path(data_dir)
    split_dir = data_dir / split
    if not split_dir.is_dir():
        found = f" ({data_dir} holds {_found(data_dir)})" if data_dir.is_dir() else ""
        hint = BUILD_HINT.format(out=data_dir)
        raise DatasetError(f"dataset split not found: {split_dir} does not exist{found}; accepted: {LAYOUTS}; {hint}")
    names = {p.name for p in split_dir.iterdir()}
    ours, reference = "inputs.npy" in names, any(n.endswith("__inputs.npy") for n in names)
    if ours != reference:
        return "trm" if ours else "reference"
    raise DatasetError(
        f"{split_dir}: {'both dataset layouts' if ours else 'neither dataset layout'}: found {_found(split_dir)}; "
        f"accepted: {LAYOUTS}; " + BUILD_HINT.format(out=data_dir)
    )


def _read_json(meta_path: Path, data_dir: str | os.PathLike[str]) -> Any:
    if not meta_path.is_file():
        hint = BUILD_HINT.format(out=data_dir)
        raise DatasetError(f"dataset split not found: {meta_path} does not exist; accepted: {LAYOUTS}; {hint}")
    try:
        return json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DatasetError(f"{meta_path}: cannot read dataset.json ({e})") from e


def _load_npy(p: Path, data_dir: str | os.PathLike[str], mmap: bool) -> np.ndarray:
    if not p.is_file():
        raise DatasetError(f"dataset file not found: {p} does not exist; " + BUILD_HINT.format(out=data_dir))
    try:
        loaded: np.ndarray = np.load(p, mmap_mode="r" if mmap else None, allow_pickle=False)
        return loaded
    except (OSError, ValueError) as e:
        raise DatasetError(f"{p}: cannot load ({e})") from e


def _load_reference(
    data_dir: str | os.PathLike[str], split: str, mmap: bool
) -> tuple[dict[str, np.ndarray], SplitMeta]:
    """A split in the reference's layout: its one set's arrays as they are, its metadata mapped onto ``SplitMeta``.

    The counts come from the arrays (the reference's ``total_puzzles`` counts groups, not puzzles), checked against
    its ``total_groups``; pad and ignore label must be this loader's (0 and 0, which the reference's Sudoku builder
    writes); the fingerprint is ``fingerprint(arrays)``."""
    split_dir = Path(data_dir) / split
    meta_path = split_dir / "dataset.json"
    raw = _read_json(meta_path, data_dir)
    missing = [k for k in REF_KEYS if not isinstance(raw, dict) or k not in raw]
    if missing:
        raise DatasetError(f"{meta_path}: the TRM reference's layout, but its dataset.json lacks {missing}")
    sets = raw["sets"]
    if not (isinstance(sets, list) and len(sets) == 1 and isinstance(sets[0], str)):
        raise DatasetError(f"{meta_path}: sets={sets!r}; only a single set is read (the Sudoku builder writes ['all'])")
    if (raw["pad_id"], raw["ignore_label_id"]) != (PAD_ID, PAD_LABEL):
        pads = f"pad_id={raw['pad_id']!r}, ignore_label_id={raw['ignore_label_id']!r}"
        raise DatasetError(f"{meta_path}: {pads}; the loader reads pad {PAD_ID} and ignore label {PAD_LABEL}")
    arrays = {name: _load_npy(split_dir / f"{sets[0]}__{name}.npy", data_dir, mmap) for name in ARRAY_NAMES}
    try:
        counts = _check_arrays(arrays)
        _check_tokens(arrays)
        if int(raw["total_groups"]) != counts["groups"]:
            raise DatasetError(
                f"arrays give {counts['groups']} groups, dataset.json's total_groups {raw['total_groups']}"
            )
        meta = SplitMeta(
            counts=counts,
            fingerprint=fingerprint(arrays),
            source={"layout": "trm-reference", "sets": sets, "total_puzzles": raw.get("total_puzzles")},
            vocab_size=int(raw["vocab_size"]),
            seq_len=int(raw["seq_len"]),
            num_puzzle_identifiers=int(raw["num_puzzle_identifiers"]),
        )
    except (DatasetError, TypeError, ValueError) as e:
        raise DatasetError(f"{split_dir}: {e}") from e
    return arrays, meta


def read_meta(data_dir: str | os.PathLike[str], split: str) -> SplitMeta:
    """Read one split's metadata: only ``dataset.json`` for this project's layout (cheap: used to compare build
    arguments); the reference's layout has no fingerprint on disk, so its arrays are read and hashed."""
    if split_layout(data_dir, split) == "reference":
        return _load_reference(data_dir, split, mmap=True)[1]
    meta_path = Path(data_dir) / split / "dataset.json"
    return SplitMeta.from_json(_read_json(meta_path, data_dir), str(meta_path))


def load_split(
    data_dir: str | os.PathLike[str], split: str, mmap: bool = True, verify: bool = False
) -> tuple[dict[str, np.ndarray], SplitMeta]:
    """Load one split of either layout (memory-mapped by default). ``verify`` re-hashes and compares the
    fingerprint; a split in the reference's layout is always hashed on load (it records none)."""
    if split_layout(data_dir, split) == "reference":
        return _load_reference(data_dir, split, mmap)
    meta = read_meta(data_dir, split)
    split_dir = Path(data_dir) / split
    arrays: dict[str, np.ndarray] = {}
    for name in ARRAY_NAMES:
        arrays[name] = _load_npy(p := split_dir / f"{name}.npy", data_dir, mmap)
        if arrays[name].dtype != DISK_DTYPE:
            raise DatasetError(f"{p}: dtype {arrays[name].dtype}, expected int32")
    try:
        counts = _check_arrays(arrays)
    except DatasetError as e:
        raise DatasetError(f"{split_dir}: {e}") from e
    if counts != meta.counts:
        raise DatasetError(f"{split_dir}: arrays give counts {counts} but dataset.json says {meta.counts}")
    if verify and fingerprint(arrays) != meta.fingerprint:
        raise DatasetError(f"{split_dir}: fingerprint mismatch (files changed after dataset.json was written)")
    return arrays, meta
