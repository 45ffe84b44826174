"""Torch-facing batching for the on-disk format: sharded, resumable training and padded evaluation.

Shapes never change (drop the epoch tail in training, pad in evaluation) so compiled/XLA graphs
are reused, and every rank sees the same number of batches so collectives stay in step.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from trm.losses import IGNORE_INDEX

from .format import PAD_ID, PAD_LABEL, DatasetError

Batch = dict[str, torch.Tensor]


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise DatasetError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")


def _to_batch(arrays: Mapping[str, np.ndarray], idx: np.ndarray, pad_label: int) -> Batch:
    """Gather rows ``idx`` as int64 tensors, with the disk's pad label mapped to the loss's IGNORE_INDEX (-100)."""
    labels = np.asarray(arrays["labels"][idx], dtype=np.int64)
    labels[labels == pad_label] = IGNORE_INDEX
    return {
        "inputs": torch.from_numpy(np.asarray(arrays["inputs"][idx], dtype=np.int64)),
        "labels": torch.from_numpy(labels),
        "puzzle_identifiers": torch.from_numpy(np.asarray(arrays["puzzle_identifiers"][idx], dtype=np.int64)),
    }


class TrainLoader:
    """Infinite iterator of fixed-size local batches (global_batch_size // world_size examples).

    An epoch means what it means in the TRM reference: every group (an original puzzle with its
    augmentations) gives one randomly chosen member, in a random order, both drawn from
    SeedSequence([seed, e]) (identical on all ranks). With 1,000 puzzles x 1,000 augmentations an epoch is
    1,000 examples, so the paper's 50,000 epochs at batch 768 are 65,104 steps. Epochs are concatenated
    into one stream and nothing is dropped (dropping each epoch's tail would lose 23% of it at batch 768):
    global batch b is stream[b*G, (b+1)*G) and rank r takes the r-th contiguous piece of it, so
    concatenating ranks 0..W-1 gives the single-process batch. A dataset without augmentations (one puzzle
    per group) gives a fresh permutation of every example each epoch.
    """

    def __init__(
        self,
        arrays: Mapping[str, np.ndarray],
        global_batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        pad_label: int = PAD_LABEL,
    ) -> None:
        _check_rank(rank, world_size)
        if global_batch_size < 1 or global_batch_size % world_size:
            raise DatasetError(
                f"global_batch_size={global_batch_size} must be a positive multiple of world_size={world_size}"
            )
        puzzle_starts = np.asarray(arrays["puzzle_indices"], dtype=np.int64)
        if not np.all(np.diff(puzzle_starts) == 1):
            raise DatasetError(
                "the train loader draws one example per puzzle, as the reference does for Sudoku: "
                "every puzzle must have exactly one example (puzzle_indices = 0, 1, 2, ...)"
            )
        self.group_starts = np.asarray(arrays["group_indices"], dtype=np.int64)
        self.num_groups = len(self.group_starts) - 1
        if self.num_groups < 1:
            raise DatasetError("the training split is empty (no puzzle groups)")
        # A batch larger than an epoch is allowed (it spans epochs, as the reference's stream does).
        if seed < 0:
            raise DatasetError(f"seed must be >= 0, got {seed}")
        self.arrays = arrays
        self.global_batch_size = global_batch_size
        self.local_batch_size = global_batch_size // world_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.pad_label = pad_label
        self.batches = 0  # global batches already taken
        self._orders: dict[int, np.ndarray] = {}

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The example indices of epoch `epoch`: one random member of each group, groups in random order."""
        if epoch not in self._orders:
            # SeedSequence([seed, epoch]) rather than seed + epoch: run seed=1 must not replay seed=0's epoch 1.
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, epoch]))
            groups = rng.permutation(self.num_groups)
            sizes = self.group_starts[groups + 1] - self.group_starts[groups]
            puzzles = self.group_starts[groups] + rng.integers(0, sizes)
            self._orders = {e: order for e, order in self._orders.items() if e >= epoch - 1}  # at most two kept
            self._orders[epoch] = puzzles  # one example per puzzle: the puzzle index is the example index
        return self._orders[epoch]

    def _stream(self, start: int, stop: int) -> np.ndarray:
        """Examples at positions [start, stop) of the concatenated epochs."""
        pieces = []
        while start < stop:
            epoch, offset = divmod(start, self.num_groups)
            take = min(stop - start, self.num_groups - offset)
            pieces.append(self.epoch_order(epoch)[offset : offset + take])
            start += take
        return np.concatenate(pieces)

    @property
    def epoch(self) -> float:
        """Epochs consumed so far (fractional): what the reference's `epochs` counts."""
        return self.batches * self.global_batch_size / self.num_groups

    def __iter__(self) -> TrainLoader:
        return self

    def __next__(self) -> Batch:
        start = self.batches * self.global_batch_size + self.rank * self.local_batch_size
        idx = self._stream(start, start + self.local_batch_size)
        self.batches += 1
        return _to_batch(self.arrays, idx, self.pad_label)

    def state_dict(self) -> dict[str, int]:
        return {"batches": self.batches}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        try:
            batches = int(state["batches"])
        except (KeyError, TypeError, ValueError) as e:
            raise DatasetError(
                f"bad loader state {state!r}: need an integer 'batches' (a checkpoint written "
                "before the loader drew epochs as the reference does cannot be resumed)"
            ) from e
        if batches < 0:
            raise DatasetError(f"bad loader state {state!r}: 'batches' must be >= 0")
        self.batches = batches


class EvalBatches:
    """Iterable of this rank's eval batches; ``len()`` is the same on every rank."""

    def __init__(
        self,
        arrays: Mapping[str, np.ndarray],
        batch_size_per_rank: int,
        rank: int,
        world_size: int,
        max_examples: int | None = None,
        pad_label: int = PAD_LABEL,
        pad_id: int = PAD_ID,
    ) -> None:
        _check_rank(rank, world_size)
        if batch_size_per_rank < 1:
            raise DatasetError(f"batch_size_per_rank must be >= 1, got {batch_size_per_rank}")
        if max_examples is not None and max_examples < 0:
            raise DatasetError(f"max_examples must be >= 0 or None, got {max_examples}")
        n = int(arrays["inputs"].shape[0])
        n = n if max_examples is None else min(n, max_examples)
        per_rank = -(-n // world_size)  # contiguous shards; the last ranks may be short or empty
        self.start = min(rank * per_rank, n)
        self.stop = min(self.start + per_rank, n)
        self.num_batches = -(-per_rank // batch_size_per_rank)
        self.arrays, self.batch_size = arrays, batch_size_per_rank
        self.pad_label, self.pad_id = pad_label, pad_id

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[Batch]:
        bs = self.batch_size
        for b in range(self.num_batches):
            lo = min(self.start + b * bs, self.stop)
            hi = min(lo + bs, self.stop)
            batch = _to_batch(self.arrays, np.arange(lo, hi), self.pad_label)
            real = hi - lo
            if real < bs:  # pad to the fixed shape; padded rows are ignored by the loss and metrics
                pad = bs - real
                batch["inputs"] = torch.cat(
                    [batch["inputs"], torch.full((pad, batch["inputs"].shape[1]), self.pad_id, dtype=torch.long)]
                )
                batch["labels"] = torch.cat(
                    [batch["labels"], torch.full((pad, batch["labels"].shape[1]), IGNORE_INDEX, dtype=torch.long)]
                )
                batch["puzzle_identifiers"] = torch.cat(
                    [batch["puzzle_identifiers"], torch.zeros(pad, dtype=torch.long)]
                )
            batch["valid"] = torch.arange(bs) < real
            yield batch


def eval_batches(
    arrays: Mapping[str, np.ndarray],
    batch_size_per_rank: int,
    rank: int,
    world_size: int,
    max_examples: int | None = None,
    pad_label: int = PAD_LABEL,
) -> EvalBatches:
    """Deterministic, unshuffled eval batches over the first ``max_examples`` examples (all if None).

    Rank r gets a contiguous shard; shards cover every example exactly once. Each batch has
    ``batch_size_per_rank`` rows plus a bool ``valid`` [B]; padded rows have labels all IGNORE_INDEX (-100).
    """
    return EvalBatches(arrays, batch_size_per_rank, rank, world_size, max_examples, pad_label)
