"""The train.kernels candidates against the TRM reference on a GPU, side by side, in one prepared run.

    python -m bench.gpu.candidates --device cuda --ref REF_DIR --ref-python python3      # the lent GPU: ~5 min
    python -m bench.gpu.candidates --device cpu --quick --out-dir /tmp/r                  # smoke run (no --ref)

Built for a lease of a few minutes (docs/benchmarks.md, "Fused kernels"): one process, three parts.
1. Correctness, eager, at --check-batch: one training step's loss and every gradient of each candidate
   (trm/kernel_choice.py choices) from the same weights and batch, against the torch path in the same precision and
   against fp32: a candidate passes when each gradient is no further from fp32 than 2x the torch path's bf16
   distance (tests/test_fused_mix.py asserts the same on a CPU, through Triton's interpreter).
2. Speed, at --batch (paper MLP-t, bf16_reference, torch.compile of the whole model): the reference (its loss
   head compiled, bench/trainer/_reference_worker.py, same weights and batch) and each candidate warm up one after
   another (the cold compiles); a candidate whose warm-up would start past --budget-s is skipped and says so.
   Then every runner and the dense matmul peak run round-robin --repeats times (bench/trainer/step.py's measure):
   medians, share of the same round's bf16 matmul peak, and same-round ratios against the reference and
   against our torch path. The first step's lm_loss of every runner is recorded (same start: they must agree
   to bf16 rounding).
   Then, with fused_mix_swiglu among them, every tile of its kernels (trm/kernels/swiglu_gemms.py TILES) launched at
   that tile at the timed shape: outputs against torch's products, a persistent tile's bits against its twin's
   with a program per tile, and the median ms of a call (the autotuner picks one tile per shape):
   bench/gpu/tile_check.py.
3. One block alone (the mix sublayer and the channel SwiGLU) at the timed steps' shape (eager, autocast,
   --precision): each candidate's forward without gradients and forward + backward, median ms over
   --sublayer-calls calls: which part a kernel saves.
4. A table (bench/results/<out-name>.md) and everything (.json), with the fastest choice that passed part 1
   (`fastest_passing`); the table is also printed last.
With --device cpu a fused candidate runs Triton's interpreter (TRITON_INTERPRET=1, set here): only --quick sizes.
--no-checks leaves part 1 and the tile check out: bench/gpu/session.py runs them as parts of their own.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

if [a for i, a in enumerate(sys.argv[1:]) if sys.argv[i] == "--device"][-1:] == ["cpu"]:  # the last, as argparse
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton loads: a fused candidate on a CPU tensor

import torch

from bench._common import StepRunner, arch_of, train_config
from bench._results import fmt, median, run_header, write_results
from bench.gpu import cli
from bench.gpu.tile_check import markdown_rows as tile_markdown
from bench.gpu.tile_check import tile_check
from bench.trainer.reference_side import ReferenceRunner, ReferenceWorker, build_reference, load_same_start
from bench.trainer.step import measure, paired_ratio, summarize, variant_row, warm_up
from bench.trainer.vs_reference import gpu_facts
from contracts.choices import KERNEL_CHOICES
from trm.flops import flops_per_sample_step
from trm.kernel_choice import apply_kernels
from trm.kernels.fused_mix import tuned_tile
from trm.kernels.fused_mix_backward import tuned_grad_tile
from trm.kernels.fused_swiglu import tuned_tiles
from trm.losses import act_loss
from trm.model import ACTModel, Block
from trm.step import autocast, carry_dtype

NAME = "gpu_candidates"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    cli.add_reference(p)
    cli.add_device(p)
    cli.add_arch(p)
    p.add_argument("--batch", type=int, default=None, help="batch of the timed steps (768; 2 with --quick)")
    p.add_argument("--check-batch", type=int, default=None, help="batch of the gradient check (32; 2 with --quick)")
    p.add_argument(
        "--candidates",
        default="torch,fused_mix_nograd,fused_mix_bwd,fused_mix_swiglu",
        help="train.kernels choices, in order",
    )
    cli.add_precision(p)
    p.add_argument("--compile", default="model", choices=("off", "net", "model"), help="train.compile of ours")
    p.add_argument("--repeats", type=int, default=None, help="measured rounds (7; 1 with --quick)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured steps per runner (the compile)")
    p.add_argument("--budget-s", type=float, default=330.0, help="start no warm-up after this many seconds")
    p.add_argument("--matmul-size", type=int, default=None, help="n of the n^3 peak (8192; 256 with --quick)")
    p.add_argument("--matmul-seconds", type=float, default=0.2)
    p.add_argument(
        "--sublayer-calls", type=int, default=None, help="timed calls per sublayer case (20; 1 --quick; 0: no part 3)"
    )
    p.add_argument("--threads", type=int, default=min(8, len(os.sched_getaffinity(0))))
    cli.add_quick(p, "smoke run: tiny arch, batch 2, 1 round")
    p.add_argument(
        "--no-checks",
        action="store_true",
        help="skip the gradient and tile checks (bench/gpu/session.py runs them apart)",
    )
    cli.add_output(p, NAME)
    args = p.parse_args(argv)
    args.arch = args.arch or ("tiny" if args.quick else "trm_mlp_t_sudoku")
    args.batch = args.batch or (2 if args.quick else 768)
    args.check_batch = args.check_batch or (2 if args.quick else 32)
    args.repeats = args.repeats or (1 if args.quick else 7)
    args.matmul_size = args.matmul_size or (256 if args.quick else 8192)
    if args.sublayer_calls is None:
        args.sublayer_calls = 1 if args.quick else 20
    args.candidates = [c for c in args.candidates.split(",") if c]
    unknown = [c for c in args.candidates if c not in KERNEL_CHOICES or c == "auto"]
    if unknown or "torch" not in args.candidates:
        raise SystemExit(f"--candidates {args.candidates}: concrete train.kernels choices, torch among them")
    return args


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    ours, reference = ours.detach().double(), reference.detach().double()
    return float((ours - reference).abs().max() / reference.abs().max().clamp_min(1e-30))


def first_step(runner: StepRunner, choice: str, precision: str) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients of one eager step of `runner`'s model (its weights, batch and fresh carry) under
    `choice` and `precision`; the optimizer does not step."""
    model: ACTModel = runner.model
    apply_kernels(model, choice)
    carry = model.initial_carry(runner.batch, carry_dtype(precision))
    with autocast(precision, torch.device(runner.device)):
        carry, logits, q_halt = model(carry, runner.batch, 0.0)
    loss, _ = act_loss(logits, q_halt, carry.labels, carry.inputs, carry.halted, carry.steps)
    (loss / runner.batch_size).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return float(loss) / runner.batch_size, grads


def gradient_check(args: argparse.Namespace, state_path: Path) -> list[dict[str, Any]]:
    """Part 1: each candidate's first-step loss and gradients against the torch path's and fp32's."""
    cfg = train_config(args.arch, args.check_batch, "fp32", ["experiment=paper_sudoku"])
    runner = StepRunner("check", cfg, args.check_batch, device=args.device)
    if state_path.exists():
        load_same_start(runner, state_path)
    fp32_loss, fp32 = first_step(runner, "torch", "fp32")
    torch_loss, torch_grads = first_step(runner, "torch", args.precision)
    rows = []
    for choice in args.candidates:
        try:
            loss, grads = first_step(runner, choice, args.precision)
        except Exception as err:  # noqa: BLE001 - a failing candidate is a result; the others still run
            traceback.print_exc(limit=5)
            rows.append({"choice": choice, "error": f"{type(err).__name__}: {err}"[:500], "passes": False})
            runner.model.zero_grad(set_to_none=True)
            continue
        ratios = {
            n: relative_error(grads[n], fp32[n]) / max(relative_error(torch_grads[n], fp32[n]), 1e-12) for n in grads
        }
        worst = max(ratios, key=ratios.__getitem__)
        rows.append(
            {
                "choice": choice,
                "loss": loss,
                "torch_loss": torch_loss,
                "fp32_loss": fp32_loss,
                "max_grad_error_vs_torch": max(relative_error(grads[n], torch_grads[n]) for n in grads),
                "max_grad_error_vs_fp32": max(relative_error(grads[n], fp32[n]) for n in grads),
                "torch_max_grad_error_vs_fp32": max(relative_error(torch_grads[n], fp32[n]) for n in grads),
                "worst_ratio_to_torch_rounding": ratios[worst],
                "worst_parameter": worst,
                "passes": set(grads) == set(fp32) and ratios[worst] <= 2.0,
            }
        )
        print(f"  check {choice}: loss {loss:.5f} (torch {torch_loss:.5f}, fp32 {fp32_loss:.5f}); "
              f"worst grad error / torch's bf16 error {ratios[worst]:.2f} ({worst})", flush=True)  # fmt: skip
    del runner
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return rows


def sublayer_times(args: argparse.Namespace, arch: Any) -> list[dict[str, Any]]:
    """Part 3: one Block, [batch, seq, hidden] of the timed steps, per candidate: median ms of a forward without
    gradients and of a forward + backward (after 2 unmeasured calls: Triton's autotuning)."""
    device = torch.device(args.device)
    block = Block(arch).to(device)
    stream = torch.bfloat16 if args.precision == "bf16_reference" else torch.float32
    h = torch.randn(args.batch, arch.total_len, arch.hidden_size, device=device).to(stream)
    grad_y = torch.randn_like(h)

    def forward() -> None:
        with torch.no_grad():
            block(h)

    def forward_backward() -> None:
        x = h.detach().requires_grad_()
        block(x).backward(grad_y)

    def median_ms(fn: Any) -> float:
        times = []
        for i in range(2 + args.sublayer_calls):
            if args.device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if args.device == "cuda":
                torch.cuda.synchronize()
            if i >= 2:
                times.append(time.perf_counter() - start)
        return 1e3 * median(times)

    rows = []
    for choice in args.candidates:
        apply_kernels(block, choice)
        try:
            with autocast(args.precision, device):
                row = {"choice": choice, "forward_ms": median_ms(forward), "train_ms": median_ms(forward_backward)}
        except Exception as err:  # noqa: BLE001 - a failing candidate is a result; the others still run
            traceback.print_exc(limit=5)
            row = {"choice": choice, "error": f"{type(err).__name__}: {err}"[:500]}
        block.zero_grad(set_to_none=True)
        rows.append(row)
        print(f"  block {choice}: {row}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.time()
    result: dict[str, Any] = run_header(NAME, argv)
    result["machine"] = {"torch": torch.__version__, "gpu": gpu_facts() if args.device == "cuda" else None}
    cfg = train_config(args.arch, args.batch, args.precision, ["experiment=paper_sudoku"])
    arch = arch_of(cfg)
    flops = flops_per_sample_step(arch)
    print(f"# {args.arch}: {flops / 1e9:.2f} GFLOP per sample-step, batch {args.batch}, {args.precision}", flush=True)

    state_path = Path(tempfile.mkdtemp(prefix="trm-candidates-")) / "state.pt"
    worker = ReferenceWorker(args.ref, args.ref_python, args.threads, args.device) if args.ref else None
    runners: list[Any] = []
    try:
        ours = {
            c: StepRunner(
                f"ours {c}", cfg, args.batch, compile=args.compile, kernels=c, state_dtype=carry_dtype(args.precision),
                device=args.device,
            )
            for c in args.candidates
        }  # fmt: skip
        ref: ReferenceRunner | None = None
        if worker is not None:
            ref = build_reference(
                worker, "reference", ours["torch"], arch, args.compile != "off", "bfloat16", state_path
            )
            for runner in ours.values():
                load_same_start(runner, state_path)
        result["gradient_check"] = [] if args.no_checks else gradient_check(args, state_path)
        # bench/gpu/tile_check.py; the interpreter: part 1's small batch
        if "fused_mix_swiglu" in args.candidates and not args.no_checks:
            tokens = (args.check_batch if args.device == "cpu" else args.batch) * arch.total_len
            result["tile_check"] = tile_check(args.device, arch, tokens, args.precision)
        result["sublayer"] = sublayer_times(args, arch) if args.sublayer_calls else []
        runners = [r for r in (ref, *ours.values()) if r is not None]
        for runner in runners:
            if time.time() - started > args.budget_s:
                runner.error = f"skipped: warm-up would start after --budget-s {args.budget_s:.0f} s"
                print(f"  {runner.name}: {runner.error}", flush=True)
                continue
            warm_up([runner], args.warmup)
        matmul = measure(runners, args.repeats, args.matmul_size, args.matmul_seconds, ("nn", "nt"), args.device)
    finally:
        if worker is not None:
            worker.close()
        state_path.unlink(missing_ok=True)
        state_path.parent.rmdir()

    rows = [{**variant_row(r, "bf16", args.compile != "off"), "first_lm_loss": r.first_lm_loss} for r in runners]
    summarize({"flops_per_step": flops * args.batch, "batch": args.batch, "matmul": matmul, "variants": rows})
    by_name = {r["variant"]: r for r in rows}
    base = by_name["ours torch"]
    for row in rows:
        ran = bool(row["times_s"])
        row["vs_reference"] = paired_ratio(by_name["reference"], row) if ran and "reference" in by_name else None
        row["vs_ours_torch"] = paired_ratio(base, row) if ran and base["times_s"] else None
    result.update(
        {
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "arch_config": vars(arch),
            "flops_per_sample_step": flops,
            "matmul": matmul,
            "variants": rows,
            "fused_mix_tile": tuned_tile(),  # what Triton's autotuner chose (trm/kernels/fused_mix.py TILES)
            "fused_mix_grad_tile": tuned_grad_tile(),  # the backward's (trm/kernels/fused_mix_backward.py BWD_TILES)
            "fused_swiglu_tiles": tuned_tiles(),  # the channel SwiGLU's (trm/kernels/swiglu_gemms.py TILES)
            "wall_s": time.time() - started,
        }
    )
    result["fastest_passing"] = fastest_passing(result)
    table = markdown(result)
    write_results(args.out_name, result, table, args.out_dir)
    return result


def fastest_passing(result: dict[str, Any]) -> str | None:
    """The train.kernels choice with the most samples/s among those that ran and passed the gradient check: the
    one to make `auto` on this GPU (None if none did)."""
    passed = {c["choice"] for c in result["gradient_check"] if c.get("passes")}
    if not all(t.get("passes") for t in result.get("tile_check", [])):  # the autotuner might pick a failing tile
        passed.discard("fused_mix_swiglu")
    timed = {r["variant"].removeprefix("ours "): r["samples_per_s"] for r in result["variants"] if r["times_s"]}
    ranked = sorted((rate, choice) for choice, rate in timed.items() if choice in passed and rate)
    return ranked[-1][1] if ranked else None


def gradient_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The gradient check as a table (also bench/gpu/gradient_check.py's)."""
    lines = [
        "| candidate | first-step loss (torch / fp32) | max grad error vs fp32 (torch's) | worst / torch's | passes |",
        "|---|---:|---:|---:|---|",
    ]
    for c in rows:
        if "error" in c:
            lines.append(f"| {c['choice']} | failed: {c['error'][:200]} ||||")
            continue
        lines.append(
            f"| {c['choice']} | {c['loss']:.5f} ({c['torch_loss']:.5f} / {c['fp32_loss']:.5f}) "
            f"| {c['max_grad_error_vs_fp32']:.4f} ({c['torch_max_grad_error_vs_fp32']:.4f}) "
            f"| {c['worst_ratio_to_torch_rounding']:.2f} ({c['worst_parameter']}) | {'yes' if c['passes'] else 'NO'} |"
        )
    return lines


def markdown(result: dict[str, Any]) -> str:
    args, gpu = result["args"], result["machine"]["gpu"]
    lines = [
        "| runner | samples/s | vs reference | vs ours torch | % of bf16 matmul peak | first step s | first lm_loss |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["variants"]:
        if not r["times_s"]:
            lines.append(f"| {r['variant']} | failed or skipped: {r['error']} ||||||")
            continue
        util = r["utilization_vs_matmul_peak"]
        lines.append(
            f"| {r['variant']} | {fmt(r['samples_per_s'], '.1f')} | {fmt(r['vs_reference'], '.2f')} "
            f"| {fmt(r['vs_ours_torch'], '.2f')} | {'-' if util is None else f'{100 * util:.1f}%'} "
            f"| {fmt(r['first_step_s'], '.1f')} | {fmt(r['first_lm_loss'], '.5f')} |"
        )
    if result["gradient_check"]:
        lines += ["", *gradient_markdown(result["gradient_check"])]
    if "tile_check" in result:
        lines += ["", *tile_markdown(result["tile_check"])]
    if result["sublayer"]:
        lines += ["", "| candidate: one block, eager | forward, no grad (ms) | forward + backward (ms) |"]
        lines.append("|---|---:|---:|")
    for c in result["sublayer"]:
        cells = f"failed: {c['error'][:200]} |" if "error" in c else f"{c['forward_ms']:.3f} | {c['train_ms']:.3f}"
        lines.append(f"| {c['choice']} | {cells} |")
    peak = median(result["matmul"]["flops_samples"]["bf16"])
    where = f"{gpu['name']} (CUDA {gpu['cuda']})" if gpu else "CPU"
    lines += [
        "",
        f"{args['arch']}, batch {args['batch']}, {args['precision']}, train.compile={args['compile']}; "
        f"{result['flops_per_sample_step'] / 1e9:.2f} GFLOP per sample-step; medians of {args['repeats']} "
        f"round-robin steps; ratios are medians of same-round step-time ratios (> 1: faster). {where}, torch "
        f"{result['machine']['torch']}; bf16 matmul peak ({args['matmul_size']}^3, nn/nt) "
        f"{fmt(peak and peak / 1e12, '.1f')} TFLOP/s; "
        + (
            "gradient and tile checks not run here (--no-checks). "
            if args.get("no_checks")
            else f"gradient check at batch {args['check_batch']}, eager. "
        )
        + f"Fastest that passes: {result.get('fastest_passing') or 'none'}.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
