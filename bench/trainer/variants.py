"""Where the train step's time goes, and what candidate code changes would buy (measured, trm/ untouched).

    python -m bench.trainer.variants                  # MLP-t batch 64, bf16: profile + variants, 3 repeats
    python -m bench.trainer.variants --batch 16 --variants fp32:baseline,fp32:fused_rms,fp32:compile_net

1. Profile: one real `trm.step.train_step` per precision under torch.profiler; self CPU time grouped into
   matmul / casts+copies / normalization / elementwise / optimizer / other, and the top ops.
2. Phases: forward (incl. the no-grad H cycles) / loss / backward / optimizer, timed on a copy of the
   train_step body.
3. Variants: candidate changes applied as monkeypatches on this process's trm.model (the files are not
   edited), each with its own model/optimizer/carry from the same seed, run round-robin; medians. The first
   step's lm_loss of each variant is recorded as a sanity check. It cannot show bitwise agreement: at init the
   21-call recursion is chaotic (a 1e-6 change of y moves the logits by O(1)), so any change of summation
   order (compile, fusion) gives a different but equally distributed first loss.

Candidates (all mathematically identical to the current code except bf16_state, which rounds the carried
y/z and the embedding to bf16 between blocks, as the TRM reference's forward_dtype=bfloat16 does; the
first-step lm_loss column shows the difference):
  mixer_matmul  MLP-t mixer as W @ h (batched matmul with the weight on the left) instead of
                Linear(h.transpose(1, 2)).transpose(1, 2): no transposed copies, contiguous residual add.
  fused_rms     F.rms_norm (aten::_fused_rms_norm) instead of the 5-op float32 expression.
  bf16_state    under bf16: carry y/z in bf16 (initial_carry(state_dtype=bf16)) and the embedding output in
                bf16, so the residual stream stops being float32 and each Linear stops casting its input.
  compile       torch.compile(ACTModel) (what bench/trainer/step.py measures): every H/L cycle unrolled, long compile.
  compile_net   RecursiveNet.compile() in place: one small graph (per grad mode / dtype) reused by all cycles.
JSON goes to bench/results/trainer_variants.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

import trm.model as M
from bench._common import RESULTS, StepRunner, machine_info, median, round_robin, train_config
from trm.losses import act_loss
from trm.step import autocast

# ----------------------------------------------------------------------------------------- patches


def _fused_rms_norm(x: Tensor, eps: float) -> Tensor:
    return F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


_ORIG_BLOCK_FORWARD = M.Block.forward
_ORIG_EMBED = M.TinyRecursiveModel.embed


def _block_forward_mixer_matmul(self: M.Block, h: Tensor) -> Tensor:
    if self.mlp_t:
        # SwiGLU over the sequence axis with the weight on the left: [2I, L] @ [B, L, D] -> [B, 2I, D].
        gate, up = torch.matmul(self.mix.gate_up.weight, h).chunk(2, dim=1)
        mixed = torch.matmul(self.mix.down.weight, F.silu(gate) * up)
    else:
        mixed = self.mix(h)
    h = M.rms_norm(h + mixed, self.eps)
    return M.rms_norm(h + self.mlp(h), self.eps)


def _embed_bf16(self: M.TinyRecursiveModel, inputs: Tensor, puzzle_identifiers: Tensor) -> Tensor:
    x = _ORIG_EMBED(self, inputs, puzzle_identifiers)
    return x.to(torch.bfloat16) if torch.is_autocast_enabled("cpu") else x


PATCHES: dict[str, list[tuple[Any, str, Any]]] = {
    "mixer_matmul": [(M.Block, "forward", _block_forward_mixer_matmul)],
    "fused_rms": [(M, "rms_norm", _fused_rms_norm)],
    "bf16_state": [(M.TinyRecursiveModel, "embed", _embed_bf16)],
}


@contextlib.contextmanager
def patched(names: tuple[str, ...]) -> Iterator[None]:
    saved = []
    try:
        for name in names:
            for owner, attr, value in PATCHES[name]:
                saved.append((owner, attr, getattr(owner, attr)))
                setattr(owner, attr, value)
        yield
    finally:
        for owner, attr, value in reversed(saved):
            setattr(owner, attr, value)


class Variant(StepRunner):
    patches: tuple[str, ...] = ()

    def step(self) -> float:
        with patched(self.patches):
            return super().step()


COMPILE_MODES = ("compile", "compile_net")
DEFAULT_VARIANTS = (
    "bf16:baseline,bf16:fused_rms,bf16:bf16_state,bf16:mixer_matmul,"
    "bf16:compile,bf16:compile_net,bf16:compile_net+bf16_state"
)


def make_variant(spec: str, arch: str, batch: int, overrides: list[str]) -> Variant:
    """spec = "<precision>:<mod>+<mod>..." with mods from PATCHES, "compile" (torch.compile of the whole ACTModel,
    as bench/trainer/step.py does) or "compile_net" (RecursiveNet.compile(): one small graph reused by every cycle)."""
    precision, _, mods_text = spec.partition(":")
    mods = tuple(m for m in mods_text.split("+") if m and m != "baseline")
    unknown = [m for m in mods if m not in PATCHES and m not in COMPILE_MODES]
    if unknown or precision not in ("fp32", "bf16"):
        raise SystemExit(
            f"bad variant {spec!r}: precision fp32|bf16, mods from {sorted(PATCHES) + list(COMPILE_MODES)}"
        )
    patches = tuple(m for m in mods if m in PATCHES)
    state_dtype = torch.bfloat16 if "bf16_state" in patches else torch.float32
    v = Variant(
        f"{precision} " + ("+".join(mods) or "baseline"),
        train_config(arch, batch, precision, overrides),
        batch,
        compile="model" if "compile" in mods else "net" if "compile_net" in mods else "off",
        state_dtype=state_dtype,
    )
    v.patches = patches
    return v


# ----------------------------------------------------------------------------------------- profile

CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "mkldnn", "onednn", "aten::_scaled_dot")),
    ("optimizer", ("Optimizer.", "aten::atan2", "aten::lerp", "aten::sqrt", "aten::sign")),
    (
        "casts+copies",
        ("aten::copy_", "aten::_to_copy", "aten::clone", "aten::contiguous", "aten::cat", "aten::constant_pad"),
    ),
    ("rms_norm parts", ("aten::pow", "aten::rsqrt", "aten::mean", "aten::_fused_rms_norm", "aten::sum")),
    (
        "elementwise",
        (
            "aten::add",
            "aten::mul",
            "aten::silu",
            "aten::div",
            "aten::where",
            "aten::sub",
            "aten::neg",
            "aten::fill_",
            "aten::zero_",
        ),
    ),
]


def categorize(name: str) -> str:
    for cat, prefixes in CATEGORIES:
        if any(name.startswith(p) or p in name for p in prefixes):
            return cat
    return "other"


def profile_step(v: Variant) -> dict[str, Any]:
    v.step()  # warm
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, patched(v.patches):
        v.step()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    by_cat: dict[str, float] = defaultdict(float)
    for e in events:
        by_cat[categorize(e.key)] += e.self_cpu_time_total
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:15]
    return {
        "variant": v.name,
        "self_cpu_s": total / 1e6,
        "categories_pct": {k: round(100 * t / total, 1) for k, t in sorted(by_cat.items(), key=lambda kv: -kv[1])},
        "top_ops": [
            {
                "op": e.key,
                "self_s": round(e.self_cpu_time_total / 1e6, 3),
                "calls": e.count,
                "pct": round(100 * e.self_cpu_time_total / total, 1),
            }
            for e in top
        ],
    }


def phase_times(v: Variant) -> dict[str, float]:
    """A copy of trm.step.train_step's body with a clock between the phases."""
    model, carry, cfg = v.model, v.carry, v.cfg
    t0 = time.perf_counter()
    with patched(v.patches):
        with autocast(cfg.train.precision, carry.y.device):
            carry, logits, q_halt = model(carry, v.batch, v.exploration, *v.cycles)
        t1 = time.perf_counter()
        loss, metrics = act_loss(logits, q_halt, carry.labels, carry.inputs, carry.halted, carry.steps, cfg.train.loss)
        t2 = time.perf_counter()
        (loss / v.batch_size).backward()
        t3 = time.perf_counter()
        for opt in v.optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
    v.carry = carry
    return {"forward": t1 - t0, "loss": t2 - t1, "backward": t3 - t2, "optimizer": t4 - t3, "total": t4 - t0}


# -------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="trm_mlp_t_sudoku")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--variants", default=DEFAULT_VARIANTS, help="comma list of <fp32|bf16>:<mod>+<mod> (see make_variant)"
    )
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--out", type=Path, default=RESULTS / "trainer_variants.json")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = p.parse_args(argv)
    started = time.time()
    info = machine_info()
    torch._dynamo.config.cache_size_limit = max(
        torch._dynamo.config.cache_size_limit, 64
    )  # several instances, one code

    variants = [make_variant(spec, args.arch, args.batch, args.overrides) for spec in args.variants.split(",") if spec]

    profiles, phases = [], {}
    if not args.no_profile:
        for v in variants:
            if v.name.endswith(" baseline"):
                prof = profile_step(v)
                profiles.append(prof)
                print(f"\nprofile {v.name}: {prof['self_cpu_s']:.2f} s self CPU; {prof['categories_pct']}", flush=True)
                for op in prof["top_ops"][:10]:
                    print(f"   {op['pct']:5.1f}%  {op['self_s']:7.3f} s  x{op['calls']:<5} {op['op']}")
                phases[v.name] = phase_times(v)
                print("   phases: " + ", ".join(f"{k} {t:.2f} s" for k, t in phases[v.name].items()), flush=True)

    for v in variants:  # warmup (compilation happens here; the baselines' first step was in the profile)
        t = v.step()
        print(f"  warmup {v.name}: {t:.2f} s", flush=True)

    def run(v: Variant, rnd: int) -> None:
        t = v.step()
        v.times.append(t)
        print(f"  round {rnd + 1} {v.name}: {t:.2f} s", flush=True)

    round_robin(variants, args.repeats, run)
    base = {v.cfg.train.precision: median(v.times) for v in variants if v.name.endswith(" baseline")}
    base_times = {v.cfg.train.precision: v.times for v in variants if v.name.endswith(" baseline")}
    rows = []
    for v in variants:
        prec = v.cfg.train.precision
        s = median(v.times)
        paired = [b / t for b, t in zip(base_times.get(prec, []), v.times)]  # same round: same machine weather
        rows.append(
            {
                "variant": v.name,
                "precision": prec,
                "patches": list(v.patches),
                "times_s": [round(t, 4) for t in v.times],
                "median_s_per_step": s,
                "min_s_per_step": min(v.times),
                "speedup_vs_baseline": base[prec] / s if base.get(prec) else None,
                "paired_speedup_median": median(paired),
                "first_step_s": v.first_step_s,
                "first_step_lm_loss": v.first_lm_loss,
            }
        )
    result = {
        "benchmark": "trainer_variants",
        "machine": info,
        "arch": args.arch,
        "batch": args.batch,
        "repeats": args.repeats,
        "profiles": profiles,
        "phases_s": phases,
        "variants": rows,
        "wall_s": time.time() - started,
        "command": "python -m bench.trainer.variants " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"\n{args.arch}, batch {args.batch}, medians of {args.repeats} round-robin steps\n")
    print(
        "| variant | s/step (median) | min | speedup (medians) | speedup (median of same-round ratios) | first step s | first-step lm_loss |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        speed = f"{r['speedup_vs_baseline']:.2f}x" if r["speedup_vs_baseline"] else "-"
        paired = f"{r['paired_speedup_median']:.2f}x" if r["paired_speedup_median"] else "-"
        print(
            f"| {r['variant']} | {r['median_s_per_step']:.2f} | {r['min_s_per_step']:.2f} | {speed} | {paired} "
            f"| {r['first_step_s']:.1f} | {r['first_step_lm_loss']:.5f} |"
        )
    print(f"\nwall {result['wall_s']:.0f} s; JSON: {args.out}")
    return result


if __name__ == "__main__":
    main()
