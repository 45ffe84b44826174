"""Does libgomp's spin-waiting hurt the train step on a busy (oversubscribed) CPU? OMP_WAIT_POLICY side by side.

    OMP_WAIT_POLICY must be set before torch loads libgomp, so each measurement is a child process:
    python -m bench.trainer.omp_wait                          # MLP-t bf16 batch 16, default vs PASSIVE, 4 rounds

Each round starts one child per policy (order alternating), each child builds the real step (bench/_common),
takes one warmup step and then `--steps` measured steps with torch's default thread count and with 1 thread
(alternating), and prints its times. Medians over rounds. Only meaningful while other processes load the
machine; on an idle machine the policies should tie. JSON goes to bench/results/omp_wait.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench._results import RESULTS, ROOT

CHILD = """
import json, sys, torch
from bench._common import StepRunner, train_config
r = StepRunner("x", train_config({arch!r}, {batch}, {precision!r}), {batch})
r.step()
default, out = torch.get_num_threads(), {{"default_threads": [], "one_thread": []}}
for _ in range({steps}):
    for key, n in (("default_threads", default), ("one_thread", 1)):
        torch.set_num_threads(n)
        out[key].append(r.step())
print("RESULT" + json.dumps(out))
"""


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="trm_mlp_t_sudoku")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--precision", default="bf16")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS / "omp_wait.json")
    args = p.parse_args(argv)
    code = CHILD.format(
        arch=args.arch,
        batch=args.batch,
        precision=args.precision,
        steps=args.steps,
    )
    policies = {"default (ACTIVE spin)": None, "PASSIVE": "PASSIVE"}
    times: dict[str, dict[str, list[float]]] = {k: {"default_threads": [], "one_thread": []} for k in policies}
    loads = []
    for rnd in range(args.rounds):
        names = list(policies) if rnd % 2 == 0 else list(policies)[::-1]
        for name in names:
            env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
            if policies[name]:
                env["OMP_WAIT_POLICY"] = policies[name]
            proc = subprocess.run(
                [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
            )
            line = next(out for out in proc.stdout.splitlines() if out.startswith("RESULT"))
            for key, values in json.loads(line[6:]).items():
                times[name][key].extend(values)
            loads.append(os.getloadavg()[0])
            print(
                f"  round {rnd + 1} {name}: "
                + ", ".join(f"{k} {[round(v, 2) for v in vs[-args.steps :]]}" for k, vs in times[name].items()),
                flush=True,
            )
    result = {
        "benchmark": "omp_wait",
        "arch": args.arch,
        "batch": args.batch,
        "precision": args.precision,
        "times_s": times,
        "loadavg_1min_samples": loads,
        "median_s": {n: {k: statistics.median(v) for k, v in d.items()} for n, d in times.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(
        f"\n{args.arch} {args.precision} batch {args.batch}, s/step medians; 1-min load average {min(loads):.1f}-{max(loads):.1f}\n"
    )
    print("| OMP_WAIT_POLICY | torch default threads | 1 thread |\n|---|---:|---:|")
    for name, d in result["median_s"].items():
        print(f"| {name} | {d['default_threads']:.2f} | {d['one_thread']:.2f} |")
    print(f"\nJSON: {args.out}")


if __name__ == "__main__":
    main()
