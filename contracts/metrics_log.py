"""A run's metrics file, `<out_dir>/metrics.jsonl`: one JSON record per log or eval point (`{"step": n,
"train/lm_loss": ..., "eval/exact_accuracy": ..., "time": ...}`), the same records W&B gets, each stamped here with
rank 0's wall clock when it was written (`time`, epoch seconds: W&B keeps its own `_timestamp`).

Rank 0 writes it (trm.run_end.RunLog); the report, benchmarks and tests read it here. No torch: the report reads
it without the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

METRICS_FILE = "metrics.jsonl"
WALL_TIME_KEY = "time"  # epoch seconds at which rank 0 wrote the record (an eval record: after the eval)


def open_metrics(out_dir: Path) -> TextIO:
    """Append: a resumed run continues its file (its records after the checkpoint's step repeat, later wins)."""
    return open(out_dir / METRICS_FILE, "a")


def read_metrics(out_dir: Path) -> list[dict[str, Any]]:
    """Every record with a step; a last line cut short by a job that is still writing is skipped."""
    records = []
    for line in (Path(out_dir) / METRICS_FILE).read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), (int, float)):
            records.append(record)
    return records
