"""Our trainer's step vs the TRM reference's, side by side: samples/s per mode (fp32/bf16, eager/compile).

    python -m bench.trainer.vs_reference --ref REF_DIR --ref-python REF_VENV/bin/python --compile
    python -m bench.trainer.vs_reference --ref ... --compile --arch trm_att_sudoku --out-name trainer_vs_reference_att
    python -m bench.trainer.vs_reference --quick --out-dir /tmp/r    # our side only, tiny arch: no checkout needed
    make bench-reference REF=REF_DIR                                   # builds REF_VENV first (below)

Both sides run the same step on the same config, batch and initial weights, the carry kept across steps:
forward through every H/L cycle, the ACT loss, backward and the optimizer step.
- ours: `trm.step.train_step` (bench/_common.StepRunner) with the paper preset's optimizers (experiment=
  paper_sudoku: Adam-atan2 + SignSGD); bf16 is the preset's train.bf16_mode (bf16_reference: carry and
  activations in bf16, as the reference's forward_dtype=bfloat16; --bf16-mode bf16 for autocast with an fp32
  carry); compile is train.compile=net (RecursiveNet.compile(); --our-compile model is train.compile=model,
  torch.compile of the whole ACTModel as bench/trainer/step.py measures).
- the reference (REF_DIR, a checkout of SamsungSAILMontreal/TinyRecursiveModels, imported from there, never
  copied): its ACTLossHead(TinyRecursiveReasoningModel_ACTV1) and the body of its pretrain.train_batch, with
  forward_dtype float32 or bfloat16, torch.compile of the loss head as pretrain.create_model does, in
  bench/trainer/_reference_worker.py: a process of its own under REF_PYTHON (driven from reference_side.py). Its
  `adam-atan2` optimizer is a CUDA-only extension: trm/adam_atan2.py (the kernel's update in plain torch, tested
  against the kernel's recorded updates) is registered as the module `adam_atan2` there. Its config is built from our arch preset field by
  field (as tests/test_fidelity.py maps the reference's to ours), and its initial state is loaded into our
  model with trm.reference_weights (same weights); the first step's lm_loss of both is recorded as a check.

REF_PYTHON: the reference needs einops and pydantic besides torch, the project's venv has no einops. Build a
venv with torch pinned first (never let pip pick a torch), then the two (what `make bench-reference` does):
    python3 -m venv REF_VENV && REF_VENV/bin/pip install torch==2.13.0
    REF_VENV/bin/pip install torch==2.13.0 einops pydantic numpy

After --warmup steps per runner (compilation happens there), both sides' runners and a dense matmul peak per
dtype run round-robin --repeats times (bench/trainer/step.py's warm_up / measure / summarize): medians, and
same-round ratios (ours vs the reference; each mode's FLOP/s over this machine's matmul peak of that dtype,
FLOPs per sample-step from trm.flops). The reference's worker steps only while ours waits, so both see the
same load. bf16 on a CPU without avx512_bf16/amx_bf16 is ~20x slower than fp32: --bf16-batch runs it smaller.
OMP_WAIT_POLICY defaults to PASSIVE (shared cores; docs/benchmarks.md). Table: bench/results/
trainer_vs_reference.md, everything: .json.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads libgomp; the worker inherits it

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench._common import MATMUL_LAYOUTS, StepRunner, arch_of, machine_info, train_config
from bench._results import RESULTS, fmt, run_header, write_results
from bench.trainer.reference_side import ReferenceRunner, ReferenceWorker, build_reference
from bench.trainer.step import measure, paired_ratio, summarize, variant_row, warm_up
from trm.flops import flops_per_sample_step
from trm.step import carry_dtype

NAME = "trainer_vs_reference"
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
FORWARD_DTYPE = {"fp32": "float32", "bf16": "bfloat16"}  # the reference's forward_dtype per mode


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--ref", type=Path, default=None, help="TinyRecursiveModels checkout (none: our side only)")
    p.add_argument(
        "--ref-python", default=sys.executable, help="interpreter of the reference's side (torch, einops, pydantic)"
    )
    p.add_argument("--arch", default=None, help="conf/arch preset (default trm_mlp_t_sudoku; tiny with --quick)")
    p.add_argument("--batch", type=int, default=None, help="batch of the fp32 modes (default 8; 2 with --quick)")
    p.add_argument("--bf16-batch", type=int, default=None, help="batch of the bf16 modes (default: --batch)")
    p.add_argument("--repeats", type=int, default=None, help="measured steps per runner (default 3; 1 with --quick)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured steps per runner first (compile happens here)")
    p.add_argument("--precisions", default=None, help="comma list of fp32,bf16 (default both; fp32 with --quick)")
    p.add_argument("--compile", action="store_true", help="also the torch.compile modes of both sides")
    p.add_argument("--bf16-mode", default="bf16_reference", choices=("bf16_reference", "bf16"), help="our bf16")
    p.add_argument("--our-compile", default="net", choices=("net", "model"), help="RecursiveNet.compile() or ACTModel")
    p.add_argument("--matmul-size", type=int, default=None, help="n of the n^3 peak matmul (2048; 256 with --quick)")
    p.add_argument("--matmul-seconds", type=float, default=None, help="per peak measurement (2; 0.2 with --quick)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch threads, both sides")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where both sides train (cuda: a GPU)")
    p.add_argument("--quick", action="store_true", help="smoke run: tiny arch, batch 2, fp32 eager, 1 repeat")
    p.add_argument("--out-dir", type=Path, default=RESULTS, help=f"where {NAME}.json/.md go")
    p.add_argument("--out-name", default=NAME, help="file name of the results (e.g. trainer_vs_reference_att)")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides of our train config (both sides follow arch.*)")
    args = p.parse_args(argv)
    args.arch = args.arch or ("tiny" if args.quick else "trm_mlp_t_sudoku")
    args.batch = args.batch or (2 if args.quick else 8)
    args.bf16_batch = args.bf16_batch or args.batch
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.precisions = [s for s in (args.precisions or ("fp32" if args.quick else "fp32,bf16")).split(",") if s]
    args.matmul_size = args.matmul_size or (256 if args.quick else 2048)
    args.matmul_seconds = args.matmul_seconds or (0.2 if args.quick else 2.0)
    if args.ref and not (args.ref / "models" / "recursive_reasoning" / "trm.py").is_file():
        raise SystemExit(
            f"--ref {args.ref} is not a TinyRecursiveModels checkout (no models/recursive_reasoning/trm.py)"
        )
    for prec in args.precisions:
        if prec not in FORWARD_DTYPE:
            raise SystemExit(f"unknown precision {prec!r}: expected fp32 or bf16")
    return args


def gpu_facts() -> dict[str, Any]:
    """The GPU both sides ran on (--device cuda): what its numbers are read against."""
    props = torch.cuda.get_device_properties(0)
    return {
        "name": props.name,
        "capability": list(torch.cuda.get_device_capability(0)),
        "multiprocessors": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "cuda": torch.version.cuda,
    }


def lscpu_model() -> str | None:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), None)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.time()
    result: dict[str, Any] = run_header(NAME, argv)
    info = machine_info()
    result["machine"] = {
        **info,
        "lscpu_model_name": lscpu_model(),
        "bf16_flags": {flag: flag in info["cpu_flags"] for flag in BF16_FLAGS},
        "device": args.device,
        "gpu": gpu_facts() if args.device == "cuda" else None,
    }
    overrides = ["experiment=paper_sudoku", *args.overrides]  # the paper's optimizer values, as the reference's
    batches = {"fp32": args.batch, "bf16": args.bf16_batch}
    modes = [(prec, compiled) for compiled in ([False, True] if args.compile else [False]) for prec in args.precisions]
    arch = arch_of(train_config(args.arch, args.batch, "fp32", overrides))
    flops = flops_per_sample_step(arch)
    where = (
        result["machine"]["gpu"]["name"] if args.device == "cuda" else f"{info['cpu_model']}, {args.threads} threads"
    )
    print(f"# {args.arch}: {flops / 1e9:.2f} GFLOP per sample-step; {where}")

    worker = ReferenceWorker(args.ref, args.ref_python, args.threads, args.device) if args.ref else None
    state_path = Path(tempfile.mkdtemp(prefix="trm-ref-state-")) / "state.pt"
    ours: dict[tuple[str, bool], StepRunner] = {}
    theirs: dict[tuple[str, bool], ReferenceRunner] = {}
    try:
        for prec, compiled in modes:
            label = f"{prec} {'compile' if compiled else 'eager'}"
            precision = args.bf16_mode if prec == "bf16" else prec
            cfg = train_config(args.arch, batches[prec], precision, overrides)
            runner = StepRunner(
                f"ours {label}",
                cfg,
                batches[prec],
                compile=args.our_compile if compiled else "off",
                state_dtype=carry_dtype(precision),
                device=args.device,
            )
            ours[prec, compiled] = runner
            if worker is None:
                continue
            theirs[prec, compiled] = build_reference(
                worker, f"reference {label}", runner, arch, compiled, FORWARD_DTYPE[prec], state_path
            )
        runners: list[Any] = [r for key in ours for r in (ours[key], theirs.get(key)) if r is not None]
        warm_up(runners, args.warmup)
        matmul = measure(
            runners, args.repeats, args.matmul_size, args.matmul_seconds, tuple(MATMUL_LAYOUTS), args.device
        )
    finally:
        if worker is not None:
            worker.close()
        state_path.unlink(missing_ok=True)
        state_path.parent.rmdir()

    rows = []
    for key in ours:
        sides: dict[str, StepRunner | ReferenceRunner | None] = {"ours": ours[key], "reference": theirs.get(key)}
        for side, done in sides.items():
            if done is not None:
                row = variant_row(done, key[0], key[1])
                rows.append({**row, "side": side, "batch": batches[key[0]], "first_lm_loss": done.first_lm_loss})
    for batch in sorted(set(batches.values())):  # per batch: summarize reads one FLOPs-per-step figure
        summarize(
            {
                "flops_per_step": flops * batch,
                "batch": batch,
                "matmul": matmul,
                "variants": [r for r in rows if r["batch"] == batch],
            }
        )
    result.update(
        {
            "reference": {"path": str(args.ref) if args.ref else None, "python": args.ref_python if args.ref else None},
            "arch": args.arch,
            "arch_config": vars(arch),
            "batches": {p: batches[p] for p in args.precisions},
            "our_bf16_mode": args.bf16_mode,
            "our_compile": args.our_compile,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "overrides": overrides,
            "flops_per_sample_step": flops,
            "matmul": matmul,
            "variants": rows,
            "modes": [compare(rows, prec, compiled) for prec, compiled in modes],
            "loadavg_end": list(os.getloadavg()),
            "wall_s": time.time() - started,
        }
    )
    write_results(args.out_name, result, markdown(result), args.out_dir)
    check_same_start(result["modes"])
    return result


def check_same_start(modes: list[dict[str, Any]]) -> None:
    """Both sides start from the same weights and batch: their first fp32 eager loss must agree to float32
    rounding, else the comparison is of two different computations and the bench exits non-zero."""
    for mode in modes:
        ours, ref = mode["ours_first_lm_loss"], mode["reference_first_lm_loss"]
        if mode["mode"] == "fp32 eager" and ours is not None and ref is not None and abs(ours - ref) > 1e-4 * abs(ref):
            raise SystemExit(
                f"fp32 eager first-step lm_loss differs: ours {ours} vs reference {ref}: not the same start"
            )


def compare(rows: list[dict[str, Any]], prec: str, compiled: bool) -> dict[str, Any]:
    """One mode, both sides: samples/s, share of the matmul peak, and ours vs the reference (same-round ratio
    of step times: > 1 means ours is faster)."""
    sides = {r["side"]: r for r in rows if r["precision"] == prec and r["compiled"] == compiled}
    ours, ref = sides["ours"], sides.get("reference")
    return {
        "mode": f"{prec} {'compile' if compiled else 'eager'}",
        "batch": ours["batch"],
        "speedup_vs_reference": paired_ratio(ref, ours) if ref is not None else None,
        **{f"{side}_{k}": (r or {}).get(k) for side, r in (("ours", ours), ("reference", ref)) for k in SIDE_KEYS},
    }


SIDE_KEYS = ("samples_per_s", "utilization_vs_matmul_peak", "first_step_s", "first_lm_loss", "error")


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| mode | batch | ours samples/s | reference samples/s | ours vs reference | ours % of matmul peak "
        "| reference % of peak | first step s (ours / ref.) | first lm_loss (ours / ref.) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    for m in result["modes"]:
        if m["ours_error"] or m["reference_error"]:
            lines.append(f"| {m['mode']} | failed: ours {m['ours_error']}; reference {m['reference_error']} |||||||")
            continue
        lines.append(
            f"| {m['mode']} | {m['batch']} | {fmt(m['ours_samples_per_s'], '.3f')} "
            f"| {fmt(m['reference_samples_per_s'], '.3f')} | {fmt(m['speedup_vs_reference'], '.2f')}{'x' if m['speedup_vs_reference'] else ''} "
            f"| {pct(m['ours_utilization_vs_matmul_peak'])} | {pct(m['reference_utilization_vs_matmul_peak'])} "
            f"| {fmt(m['ours_first_step_s'], '.1f')} / {fmt(m['reference_first_step_s'], '.1f')} "
            f"| {fmt(m['ours_first_lm_loss'], '.4f')} / {fmt(m['reference_first_lm_loss'], '.4f')} |"
        )
    mach, peak = result["machine"], result["matmul"]["median_flops"]
    flags = ", ".join(f"{f} {'yes' if v else 'no'}" for f, v in mach["bf16_flags"].items())
    lines += [
        "",
        f"{result['arch']}, {result['flops_per_sample_step'] / 1e9:.2f} GFLOP per sample-step; medians of "
        f"{result['repeats']} round-robin steps after {result['warmup']} warm-up; ours vs reference = median of "
        "same-round step-time ratios (> 1: ours faster). Ours: bf16 = "
        f"{result['our_bf16_mode']}, compile = {'RecursiveNet.compile()' if result['our_compile'] == 'net' else 'torch.compile(ACTModel)'}; "
        "reference: forward_dtype float32/bfloat16, compile = torch.compile(loss head)."
        + ("" if result["reference"]["path"] else " **Reference not run (no --ref).**"),
        *(
            [
                f"GPU: {mach['gpu']['name']} (capability {mach['gpu']['capability']}, CUDA {mach['gpu']['cuda']}); "
                "both sides and the matmul peak ran there."
            ]
            if mach.get("gpu")
            else []
        ),
        f"Machine: {mach['lscpu_model_name'] or mach['cpu_model']} ({flags}; {mach['cpu_flags']}), "
        f"{mach['usable_cores']} cores, torch {mach['torch']}, {mach['torch_threads']} threads, "
        f"OMP_WAIT_POLICY={mach['env']['OMP_WAIT_POLICY']}; load average {mach['loadavg'][0]} at the start, "
        f"{result['loadavg_end'][0]:.2f} at the end.",
        f"Matmul peak (fastest of the {'/'.join(result['matmul']['layouts'])} layouts of a {result['matmul']['n']}^3 "
        "torch.matmul, interleaved with the steps): fp32 "
        f"{fmt(peak['fp32'] and peak['fp32'] / 1e9, '.1f')} GFLOP/s, bf16 {fmt(peak['bf16'] and peak['bf16'] / 1e9, '.1f')} GFLOP/s.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
