"""The command-line options the device scripts share (bench/gpu/*.py), spelled once: bench/gpu/session.py and
bench/gpu/call.sh pass the same flags to every part, so a flag's name, default and choices must not drift."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench._results import RESULTS

PRECISIONS = ("bf16_reference", "bf16")


def add_reference(p: argparse.ArgumentParser) -> None:
    """--ref, --ref-python: the TinyRecursiveModels checkout to compare with, and its interpreter."""
    p.add_argument("--ref", type=Path, default=None, help="TinyRecursiveModels checkout (none: ours only)")
    p.add_argument("--ref-python", default=sys.executable, help="interpreter of the reference (einops, pydantic)")


def add_device(p: argparse.ArgumentParser) -> None:
    """--device: cuda on the lent machine; cpu runs Triton's interpreter (the suite's mode)."""
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))


def add_arch(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch", default=None, help="conf/arch preset (trm_mlp_t_sudoku; tiny with --quick)")


def add_precision(p: argparse.ArgumentParser) -> None:
    p.add_argument("--precision", default=PRECISIONS[0], choices=PRECISIONS)


def add_quick(p: argparse.ArgumentParser, what: str = "tiny arch, batch 2: the interpreter's sizes") -> None:
    p.add_argument("--quick", action="store_true", help=what)


def add_output(p: argparse.ArgumentParser, name: str, out_dir: Path = RESULTS) -> None:
    """--out-dir, --out-name: where the result's JSON and Markdown go (bench._results.write_results)."""
    p.add_argument("--out-dir", type=Path, default=out_dir)
    p.add_argument("--out-name", default=name)
