"""The prepared device call: every result the next lent GPU should give, in one run, each part with its own budget.

    python -m bench.gpu.session --device cuda --ref .device/ref --ref-python python3 --out-dir $OUT   # bench/gpu/call.sh run
    python -m bench.gpu.session --device cpu --out-dir /tmp/s     # the CPU mode: tiny shapes, Triton's interpreter

The parts, in order (PARTS; each writes <out-dir>/<part>.json and .md):
  candidates      bench/gpu/candidates.py --no-checks: the shipped candidates and the reference in the same rounds
                  (7, rotating order) with the bf16 matmul peak measured in each
  tile_check      bench/gpu/tile_check.py: every shipped SwiGLU tile against torch, a persistent tile's bits against its
                  one-program-per-tile twin
  gradient_check  bench/gpu/gradient_check.py: each candidate's first-step gradients against torch's and fp32's
  profile         bench/gpu/profile.py on the winner: the fastest candidate that passed both checks
  bf16_train      bench/learning_curve.py: `python -m trm.train train.precision=bf16` of the shipped code, short
  curves          bench/gpu/kernel_curves.py: 300 steps of fused vs torch vs the reference from the same weights
A part that fails, raises or runs past its budget is recorded as such (its exit code, the tail of its log) and the
next one runs: no part's result is lost to another's failure. <out-dir>/gpu_session.json indexes them, rewritten
after each part; bench/gpu/docs.py renders docs/benchmarks.md's GPU rows from it.

On --device cuda each part is a process of its own (a part's CUDA fault cannot poison the next), killed at its
budget; its log is <out-dir>/logs/<part>.log. On --device cpu the parts run in this process (an interpreter start
costs more than a tiny part), Triton's interpreter for the fused kernels, tiny shapes and few steps, and budgets are
only compared; the profile is skipped (torch.profiler's CUDA kernel times need a GPU) and so is the reference
without --ref: gpu_session.json's `not_run` names what was left out and why. Exits 1 when a part failed (after the
index is written).
"""

from __future__ import annotations

import os
import sys

if [a for i, a in enumerate(sys.argv[1:]) if sys.argv[i] == "--device"][-1:] == ["cpu"]:  # the last, as argparse
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton loads, for the parts run in this process
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import contextlib
import importlib
import json
import shutil
import signal
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._results import ROOT, run_header
from bench.gpu import cli

NAME = "gpu_session"
Argv = Callable[[argparse.Namespace, dict[str, Any]], list[str]]


@dataclass(frozen=True)
class Part:
    """One result of the session: a bench module's main(argv), its budget on the device, and when it cannot run."""

    name: str
    module: str
    out_name: str  # what the module writes: <out-dir>/<out_name>.json (its --out-name)
    budget_s: float  # on the device; the budgets sum to SESSION_BUDGET_S
    argv: Argv  # the module's arguments from the session's and the earlier parts' results
    cpu_skip: str = ""  # why the CPU mode does not run it ("" runs it)


def _ref(args: argparse.Namespace) -> list[str]:
    return ["--ref", str(args.ref), "--ref-python", args.ref_python] if args.ref else []


def _size(args: argparse.Namespace) -> list[str]:
    return ["--device", args.device, "--out-dir", str(args.out_dir)] + (["--quick"] if args.device == "cpu" else [])


def _candidates(args: argparse.Namespace, _: dict[str, Any]) -> list[str]:
    cpu = (
        ["--compile", "off", "--warmup", "0", "--repeats", "2", "--sublayer-calls", "0"] if args.device == "cpu" else []
    )
    timing = ["--repeats", "7", "--budget-s", "130"] if args.device == "cuda" else []
    return [*_size(args), *_ref(args), "--candidates", args.candidates, "--no-checks", *timing, *cpu]


def _tile_check(args: argparse.Namespace, _: dict[str, Any]) -> list[str]:
    return _size(args)


def _gradient_check(args: argparse.Namespace, _: dict[str, Any]) -> list[str]:
    return [*_size(args), "--candidates", args.candidates]


def _profile(args: argparse.Namespace, results: dict[str, Any]) -> list[str]:
    return ["--kernels", results["winner"] or "torch", "--out-dir", str(args.out_dir), "--out-name", "profile"]


def _bf16_train(args: argparse.Namespace, _: dict[str, Any]) -> list[str]:
    run = args.scratch  # checkpoints stay off $OUT (what comes back from the device is capped)
    where = ["--out-dir", str(run / "run"), "--data-root", str(run / "data"), "--results-dir", str(args.out_dir)]
    if args.device == "cpu":
        shape = ["experiment=test_tiny", "train.steps=4", "train.eval_interval=2", "train.log_interval=2"]
    else:  # the paper's MLP-t on generated puzzles; kernels and compile as shipped (auto, off)
        shape = ["experiment=tiny_cpu", "arch=trm_mlp_t_sudoku", "train.steps=100", "train.eval_interval=50"]
        shape += ["train.global_batch_size=256", "train.eval_examples=256", "data.num_train=1024", "data.num_test=256"]
    return [*where, "--out-name", "bf16_train", *shape, "train.precision=bf16", f"runtime.device={args.device}"]


def _curves(args: argparse.Namespace, _: dict[str, Any]) -> list[str]:
    return [*_size(args), *_ref(args), *(["--steps", "2"] if args.device == "cpu" else [])]


PARTS = (
    Part("candidates", "bench.gpu.candidates", "gpu_candidates", 180, _candidates),
    Part("tile_check", "bench.gpu.tile_check", "tile_check", 45, _tile_check),
    Part("gradient_check", "bench.gpu.gradient_check", "gradient_check", 40, _gradient_check),
    Part("profile", "bench.gpu.profile", "profile", 75, _profile, "torch.profiler's CUDA kernel times need a GPU"),
    Part("bf16_train", "bench.learning_curve", "bf16_train", 60, _bf16_train),
    Part("curves", "bench.gpu.kernel_curves", "kernel_curves", 80, _curves),
)
OUT_NAME = {p.name: p.out_name for p in PARTS}
NO_REFERENCE = "no --ref (a TinyRecursiveModels checkout): the candidates and the curves run ours only"
SESSION_BUDGET_S = sum(p.budget_s for p in PARTS)  # 480 s: 8 minutes, a rerun's margin in a 15-minute lease


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    cli.add_device(p)
    cli.add_reference(p)
    p.add_argument("--candidates", default="torch,fused_mix_swiglu", help="train.kernels choices (the shipped ones)")
    p.add_argument("--parts", default=",".join(p.name for p in PARTS), help="which parts, in PARTS' order")
    p.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results" / NAME)
    args = p.parse_args(argv)
    args.parts = [name for name in args.parts.split(",") if name]
    unknown = set(args.parts) - {p.name for p in PARTS}
    if unknown:
        raise SystemExit(f"--parts {sorted(unknown)}: not parts of the session; they are {[p.name for p in PARTS]}")
    args.out_dir = args.out_dir.resolve()
    args.scratch = Path(tempfile.mkdtemp(prefix="trm-gpu-session-"))  # removed at the session's end
    return args


def run_in_process(part: Part, argv: list[str], log: Path) -> dict[str, Any]:
    """part.module's main(argv) here: its exit code (0, a SystemExit's, 1 for an exception), the error's tail."""
    outcome: dict[str, Any] = {"rc": 0}
    with open(log, "w") as out, contextlib.redirect_stdout(out):
        try:
            returned = importlib.import_module(part.module).main(argv)
            outcome["rc"] = returned if isinstance(returned, int) else 0  # learning_curve returns trm.train's code
        except SystemExit as stop:
            outcome["rc"] = stop.code if isinstance(stop.code, int) else 1
            outcome["error"] = None if isinstance(stop.code, int) else str(stop.code)[-2000:]
        except Exception:  # noqa: BLE001 - a failing part is a result; the next part still runs
            outcome.update(rc=1, error=traceback.format_exc(limit=8)[-2000:])
    return outcome


def run_as_process(part: Part, argv: list[str], log: Path, budget_s: float) -> dict[str, Any]:
    """python -m part.module argv in a session of its own, output to `log`, its process group killed at budget_s."""
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", part.module, *argv], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            return {"rc": proc.wait(timeout=budget_s)}
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its group: the reference worker and compile workers too
            proc.wait()
            return {"rc": -signal.SIGKILL, "timed_out": True}


def run_part(part: Part, args: argparse.Namespace, results: dict[str, Any], isolate: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"part": part.name, "module": part.module, "budget_s": part.budget_s}
    if args.device == "cpu" and part.cpu_skip:
        return {**row, "status": "skipped", "reason": part.cpu_skip}
    try:
        argv = part.argv(args, results)
    except Exception as err:  # noqa: BLE001 - an earlier part's missing result: this one cannot start
        return {**row, "status": "failed", "rc": None, "error": f"no arguments: {type(err).__name__}: {err}"}
    row["argv"] = argv
    log = args.out_dir / "logs" / f"{part.name}.log"
    start = time.perf_counter()
    outcome = run_as_process(part, argv, log, part.budget_s) if isolate else run_in_process(part, argv, log)
    row.update(outcome, wall_s=round(time.perf_counter() - start, 2), log=str(log.relative_to(args.out_dir)))
    result_file = args.out_dir / f"{part.out_name}.json"
    row["result"] = result_file.name if result_file.exists() else None
    row["over_budget"] = row["wall_s"] > part.budget_s
    row["status"] = "ok" if row["rc"] == 0 and row["result"] else "failed"
    if row["status"] == "failed":
        row["log_tail"] = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    return row


def winner(out_dir: Path) -> str | None:
    """The fastest candidate that ran and passed the gradient check and the tile check (bench.gpu.candidates'
    fastest_passing over the three parts' results); None if a part is missing or none passed."""
    from bench.gpu.candidates import fastest_passing

    try:
        candidates, grads, tiles = (
            json.loads((out_dir / f"{OUT_NAME[n]}.json").read_text())
            for n in ("candidates", "gradient_check", "tile_check")
        )
    except (OSError, ValueError):
        return None
    return fastest_passing(
        {"variants": candidates["variants"], "gradient_check": grads["gradient_check"], "tile_check": tiles["tiles"]}
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    (args.out_dir / "logs").mkdir(parents=True, exist_ok=True)
    session: dict[str, Any] = run_header(NAME, argv)
    session.update(device=args.device, budget_s=SESSION_BUDGET_S, candidates=args.candidates.split(","), parts=[])
    session["reference"] = str(args.ref) if args.ref else None
    session["not_run"] = {  # what this mode leaves out, and why (a skipped part's row says it too)
        **{p.name: p.cpu_skip for p in PARTS if args.device == "cpu" and p.cpu_skip and p.name in args.parts},
        **({} if args.ref else {"reference": NO_REFERENCE}),
    }
    session["triton"] = "interpreter (TRITON_INTERPRET=1)" if os.environ.get("TRITON_INTERPRET") == "1" else "compiled"
    started = time.perf_counter()
    try:
        run_parts(args, session, started)
    finally:
        shutil.rmtree(args.scratch, ignore_errors=True)
    session.setdefault("winner", winner(args.out_dir))
    (args.out_dir / f"{NAME}.json").write_text(json.dumps(session, indent=2))
    print(f"# session: {session['wall_s']:.0f} s of {SESSION_BUDGET_S:.0f}; winner {session['winner']}", flush=True)
    if any(row["status"] == "failed" for row in session["parts"]):
        raise SystemExit(1)
    return session


def run_parts(args: argparse.Namespace, session: dict[str, Any], started: float) -> None:
    """Every part of --parts in PARTS' order, the index rewritten after each; the profile's argv reads the winner."""
    results: dict[str, Any] = {"winner": None}
    for part in PARTS:
        if part.name not in args.parts:
            continue
        if part.name == "profile":
            results["winner"] = session["winner"] = winner(args.out_dir)
        print(f"# {part.name} ({part.module}, budget {part.budget_s:.0f} s)", flush=True)
        row = run_part(part, args, results, isolate=args.device == "cuda")
        session["parts"].append(row)
        print(
            f"  {row['status']} rc={row.get('rc')} in {row.get('wall_s', 0):.0f} s {row.get('reason', '')}", flush=True
        )
        if row["status"] == "failed":
            print(row.get("error") or row.get("log_tail", "")[-1500:], flush=True)
        session["wall_s"] = round(time.perf_counter() - started, 2)
        (args.out_dir / f"{NAME}.json").write_text(json.dumps(session, indent=2))  # after each part: a kill keeps it


if __name__ == "__main__":
    main()
