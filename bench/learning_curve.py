"""Learning curve of the default tiny preset: runs `python -m trm.train` and tabulates its eval metrics.

    python -m bench.learning_curve                                  # the full default run (experiment=tiny_cpu)
    python -m bench.learning_curve train.steps=40 train.eval_interval=20   # smoke run
    python -m bench.learning_curve --resume                         # continue bench/results/tiny_run

Extra arguments are Hydra overrides passed to trm.train unchanged. The run writes to bench/results/tiny_run
(out_dir and hydra.run.dir) with its generated data under bench/results/data; an existing tiny_run is
removed first unless --resume (trm.train would otherwise resume from its checkpoint and append to its
metrics). metrics.jsonl carries no timestamps, so this script follows the file while the run goes and
stamps each record with the wall seconds since launch at which it appeared (eval rows: after the eval).
Writes bench/results/learning_curve.json and bench/results/learning_curve.md (the markdown table); --results-dir and
--out-name put them elsewhere (bench/gpu/session.py's bf16 training run).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
EVAL_KEYS = ("eval/exact_accuracy", "eval/blank_accuracy", "eval/accuracy")


class Follower:
    """Reads the complete lines appended to a file since the last call, stamped with wall seconds."""

    def __init__(self, path: Path, start: float):
        self.path, self.start, self.offset, self.records = path, start, 0, []

    def poll(self) -> None:
        if not self.path.exists():
            return
        with open(self.path) as f:
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind("\n") + 1]
        self.offset += len(complete.encode())
        now = round(time.time() - self.start, 2)
        for line in complete.splitlines():
            if line.strip():
                self.records.append({**json.loads(line), "wall_s": now})


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| step | eval/exact_accuracy | eval/blank_accuracy | eval/accuracy | wall s |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['step']} | " + " | ".join(f"{r[k]:.4f}" for k in EVAL_KEYS) + f" | {r['wall_s']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", type=Path, default=RESULTS / "tiny_run")
    p.add_argument("--data-root", type=Path, default=RESULTS / "data")
    p.add_argument("--resume", action="store_true", help="keep an existing out dir (trm.train resumes from it)")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between looks at metrics.jsonl")
    p.add_argument("--results-dir", type=Path, default=RESULTS, help="where <out-name>.json and .md go")
    p.add_argument("--out-name", default="learning_curve", help="file name of the results")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for trm.train (e.g. train.steps=40)")
    args = p.parse_args(argv)
    out, data_root = args.out_dir.resolve(), args.data_root.resolve()

    if out.exists() and not args.resume:
        if RESULTS.resolve() not in out.parents:
            raise SystemExit(f"{out} exists and is outside {RESULTS}: remove it yourself or pass --resume")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "trm.train",
        f"out_dir={out}",
        f"hydra.run.dir={out}",
        f"data.root={data_root}",
        "train.progress=false",
        *args.overrides,
    ]
    print("$ " + " ".join(cmd), flush=True)

    start = time.time()
    follower = Follower(out / "metrics.jsonl", start)
    follower.offset = (out / "metrics.jsonl").stat().st_size if (out / "metrics.jsonl").exists() else 0
    proc = subprocess.Popen(cmd, cwd=ROOT)
    while proc.poll() is None:
        time.sleep(args.poll)
        follower.poll()
    follower.poll()
    wall = time.time() - start

    evals = [
        {"step": r["step"], **{k: r[k] for k in EVAL_KEYS}, "wall_s": r["wall_s"]}
        for r in follower.records
        if "eval/exact_accuracy" in r
    ]
    train = [r for r in follower.records if "train/lm_loss" in r]
    summary_path = out / "summary.json"
    result = {
        "benchmark": "learning_curve",
        "command": " ".join(["python", "bench/learning_curve.py", *(sys.argv[1:] if argv is None else argv)]),
        "train_command": cmd[1:],
        "overrides": args.overrides,
        "returncode": proc.returncode,
        "wall_s": round(wall, 2),
        "summary": json.loads(summary_path.read_text()) if summary_path.exists() else None,
        "eval": evals,
        "train": train,
    }
    table = markdown(evals)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / f"{args.out_name}.json").write_text(json.dumps(result, indent=2))
    header = f"`{result['command']}` — exit {proc.returncode}, {wall:.0f} s wall\n\n"
    (args.results_dir / f"{args.out_name}.md").write_text(header + table + "\n")
    print()
    print(header + table)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
