"""How long does a checkpoint save block training when checkpoint.url is a slow remote store? Direct vs staged.

    python -m bench.checkpoint_blocking                 # the paper MLP-t's weights + optimizer state, 5 rounds
    python -m bench.checkpoint_blocking --quick         # the tiny preset, 2 rounds (a smoke run)

The remote store is a stand-in: a local directory behind an fsspec filesystem (`slowremote://`) that adds
`--latency-ms` to every file opened and moves data at `--mb-per-s` (writes and reads alike), as an object store
reached over a network would. What is timed is rank 0's part of a save (trm/checkpointer.py `write`, the trainer's
own code) on a real model's state after one real step:

- direct (checkpoint.staging=never, today's path before this change): encode, write to the store, read back,
  rotate, rename; training waits for all of it.
- staged (checkpoint.staging=auto for this remote url): encode, write to a local directory, start the upload;
  training waits for that; the upload (timed separately, until it has landed) runs meanwhile.
- staged back-to-back: saves with no training between them, so each also waits for the previous upload (the
  worst case: an upload that takes longer than an eval interval).

Rounds alternate the setups; medians over rounds. JSON and the table go to bench/results/checkpoint_blocking.*.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from bench._common import StepRunner, train_config
from bench._results import RESULTS, fmt, median, run_header, write_results
from trm.checkpointer import write
from trm.checkpoints.upload import Uploads


class SlowRemoteFileSystem(LocalFileSystem):
    """A local directory with a network's latency per file opened and its bandwidth on every byte moved."""

    protocol = "slowremote"
    latency_s = 0.05
    bytes_per_s = 100e6

    def _open(self, path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        time.sleep(self.latency_s)
        handle = super()._open(path, mode, *args, **kwargs)
        move = handle.write if "w" in mode else handle.read
        pace = self.bytes_per_s

        def paced(*a: Any) -> Any:
            out = move(*a)
            time.sleep((len(a[0]) if "w" in mode else len(out)) / pace)
            return out

        setattr(handle, "write" if "w" in mode else "read", paced)
        return handle


def _settings(url: str, staging: str, local_dir: Path) -> Any:
    return SimpleNamespace(url=url, staging=staging, local_dir=str(local_dir), upload_wait_s=600.0)


def measure(state: dict[str, Any], work: Path, rounds: int) -> dict[str, list[float]]:
    """Seconds blocked per save for each setup, and each staged upload's seconds until landed."""
    times: dict[str, list[float]] = {"direct": [], "staged": [], "upload": [], "staged_back_to_back": []}
    remote = f"{SlowRemoteFileSystem.protocol}://{work}/remote"
    for r in range(rounds):
        order = ["direct", "staged", "staged_back_to_back"]
        for setup in order[r % 3 :] + order[: r % 3]:  # a different setup first in each round
            uploads = Uploads()
            staging = "never" if setup == "direct" else "auto"
            settings = _settings(f"{remote}-{setup}", staging, work / f"staging-{setup}")
            saves = 2 if setup == "staged_back_to_back" else 1
            for i in range(saves):
                started = time.perf_counter()
                write({**state, "step": r * 10 + i}, settings, False, uploads)
                blocked = time.perf_counter() - started
            times[setup].append(blocked)  # back-to-back: the second save, which waited for the first upload
            if setup == "staged":
                assert uploads.wait(None) is None
                times["upload"].append(time.perf_counter() - started)
            assert uploads.wait(None) is None
    return times


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--arch", default="trm_mlp_t_sudoku")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--latency-ms", type=float, default=50.0)
    p.add_argument("--mb-per-s", type=float, default=100.0)
    p.add_argument("--quick", action="store_true", help="the tiny preset, 2 rounds")
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    arch, rounds = ("tiny", 2) if args.quick else (args.arch, args.rounds)
    SlowRemoteFileSystem.latency_s, SlowRemoteFileSystem.bytes_per_s = args.latency_ms / 1e3, args.mb_per_s * 1e6
    fsspec.register_implementation(SlowRemoteFileSystem.protocol, SlowRemoteFileSystem, clobber=True)
    runner = StepRunner("ckpt", train_config(arch, 8, "fp32"), 8)
    runner.step()  # optimizer state exists after one step, as in any checkpoint but the first
    state = {"model": runner.model.state_dict(), "optimizers": [o.state_dict() for o in runner.optimizers]}
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-") as tmp:
        times = measure(state, Path(tmp), rounds)
        size = (Path(tmp) / "staging-staged" / "staged.pt").stat().st_size
    medians = {k: median(v) for k, v in times.items()}
    table = "\n".join(
        [
            f"| setup ({arch}, {size / 1e6:.1f} MB; store: {args.latency_ms:g} ms + {args.mb_per_s:g} MB/s) "
            "| training blocked per save, median s | upload until landed, median s |",
            "|---|---:|---:|",
            f"| direct (before) | {fmt(medians['direct'])} | - |",
            f"| staged (after) | {fmt(medians['staged'])} | {fmt(medians['upload'])} |",
            f"| staged, saves back-to-back | {fmt(medians['staged_back_to_back'])} | - |",
        ]
    )
    result = {**run_header("checkpoint_blocking", argv), "arch": arch, "bytes": size, "times": times}
    write_results("checkpoint_blocking", {**result, "medians": medians}, table, args.out_dir)


if __name__ == "__main__":
    main()
