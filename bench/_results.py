"""Torch-free pieces every bench script shares: where results go, medians and percentiles, the machine's
facts, and writing a run's JSON + markdown. (The storage bench's client processes import this; they must not
pay for torch.)"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    if math.isinf(ordered[high]):  # inf - inf is nan: a percentile that reaches "never" is never
        return ordered[high] if rank > low or math.isinf(ordered[low]) else ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # what decides bf16's speed on a CPU (docs/benchmarks.md, Machines)


def cpu_facts() -> dict[str, Any]:
    """CPU model, core counts and load: the context every number in docs/benchmarks.md is read in. A cloud VM's
    model name is often generic ("Intel(R) Xeon(R) Processor"): the family/model and the bf16 units tell them apart."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())  # the first processor's
    except OSError:
        pass
    return {
        "cpu_model": info.get("model name", "unknown"),
        "cpu_family_model": f"{info.get('cpu family', '?')}/{info.get('model', '?')}",
        "bf16_units": [flag for flag in BF16_FLAGS if flag in info.get("flags", "").split()],
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": platform.python_version(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def run_header(name: str, argv: list[str] | None) -> dict[str, Any]:
    """What every result starts with: which bench, the command that reproduces it, the machine it ran on."""
    args = sys.argv[1:] if argv is None else argv
    spec = sys._getframe(1).f_globals.get("__spec__")  # the calling bench's module, under -m and in-process alike
    module = spec.name if spec is not None else f"bench.{name}"
    return {"benchmark": name, "command": " ".join(["python", "-m", module, *args]), "machine": cpu_facts()}


def write_results(name: str, result: dict[str, Any], table: str, out_dir: Path = RESULTS) -> Path:
    """bench/results/<name>.json (everything) and <name>.md (the table docs/benchmarks.md quotes); prints the table."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    (out_dir / f"{name}.md").write_text(table + "\n")
    print(table)
    print(f"\nJSON: {path}")
    return path


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)
