"""Run the real TRM train step for a few steps in a fresh process; write what the tests compare.

`python tests/xla/_worker.py OUT.pt [options]`. Separate processes because XLA's SPMD mode and the virtual
CPU device count (CPU_NUM_DEVICES) are fixed per process, before the first XLA tensor exists.

The loop is trm.train's: the runtime from `init_runtime` (backend from the config), the model built on
the CPU from one seed and moved to the runtime's device, the config's optimizers with their lr schedule set
every step, `runtime.to_device`, `trm.train.train_step` with `runtime.loss_divisor`, the EMA update, then
`runtime.step_boundary()`. Per step it records the metric sums and the XLA compile/execute counters.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from contracts.hydra_app import compose_train_config  # noqa: E402 - after sys.path names the checkout
from tests.config_blocks import block  # noqa: E402 - after sys.path names the checkout
from trm.model import ACTModel, TRMConfig  # noqa: E402 - after sys.path names the checkout
from trm.optim import build_ema, build_optimizers, lr_multiplier, set_lr, update_ema  # noqa: E402 - after sys.path names the checkout
from trm.runtime import init_runtime  # noqa: E402 - after sys.path names the checkout
from trm.step import autocast, carry_dtype, train_step  # noqa: E402 - after sys.path names the checkout

# The test_tiny preset (conf/experiment/test_tiny.yaml): a 16-wide model in fp32, 16 slots per batch (divisible by
# 1, 2 and 4 devices); the worker makes its own batches, so the preset's data and eval settings go unread.
TINY = [
    "experiment=test_tiny",
    "arch.puzzle_emb_len=2",
    # The lr changes every step, as in a real warmup. Odd values on purpose: XLA passes Python-float scalars
    # as graph inputs and shares equal ones, so a step where e.g. lr*wd == 1e-5 (rms_norm_eps) or 1e-6
    # (clip_grad_norm_'s eps) has a different graph and compiles once more (see the lane's report).
    "optim.lr=1.1e-3",
    "optim.warmup_steps=997",
    "optim.ema_decay=0.9",
]
NUM_PUZZLES = 8


def batches(n: int, size: int, seq_len: int = 81, vocab: int = 11, seed: int = 1234) -> list[dict[str, torch.Tensor]]:
    """Sudoku-shaped batches (tokens 1..10 in, digits 2..10 out), the same for every backend."""
    gen = torch.Generator().manual_seed(seed)
    return [
        {
            "inputs": torch.randint(1, vocab, (size, seq_len), generator=gen),
            "labels": torch.randint(2, vocab, (size, seq_len), generator=gen),
            "puzzle_identifiers": torch.randint(0, NUM_PUZZLES, (size,), generator=gen),
        }
        for _ in range(n)
    ]


def counters() -> dict[str, float]:
    if "torch_xla" not in sys.modules:
        return {}
    import torch_xla.debug.metrics as met

    def count(name: str) -> float:
        return float(met.counter_value(name) or 0)

    def samples(name: str) -> float:
        data = met.metric_data(name)
        return float(data[0]) if data else 0.0

    return {
        "UncachedCompile": count("UncachedCompile"),
        "CachedCompile": count("CachedCompile"),
        "LocalScalarDense": count("aten::_local_scalar_dense"),  # .item(), bool(tensor), Python branches
        "ToCpu": count("xla::_to_cpu"),
        "TransfersFromDevice": samples("TransferFromDeviceTime"),
        # runtime.compile_cache_dir: lookups of the persistent cache (a found entry that PJRT's CPU client cannot
        # load counts as a DeserializeFailure, not a hit: see trm/runtime/xla.py)
        "PersistentCacheMiss": count("PersistentCacheMiss"),
        "PersistentCacheHit": count("PersistentCacheHit"),
        "PersistentCacheDeserializeFailure": count("PersistentCacheDeserializeFailure"),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--stage-at", type=int, default=None, help="step from which (H, L) = --stage-cycles")
    parser.add_argument("--stage-cycles", default="1,2")
    parser.add_argument("--exploration", type=float, default=0.0)
    parser.add_argument("--ema", action="store_true")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_intermixed_args()

    cfg = compose_train_config([*TINY, *args.overrides])
    runtime = init_runtime(block("runtime", *TINY, *args.overrides))
    arch = TRMConfig.from_dict(dict(cfg.arch), vocab_size=11, seq_len=81, num_puzzle_identifiers=NUM_PUZZLES)
    torch.manual_seed(cfg.seed)
    model = ACTModel(arch).to(runtime.device)
    optimizers = build_optimizers(model, block("optim", *TINY, *args.overrides))
    ema = build_ema(model, cfg.optim.ema_decay) if args.ema else None
    loss_divisor = runtime.loss_divisor(cfg.train.global_batch_size)
    step_model = runtime.wrap_model(model)
    stage_cycles = tuple(int(c) for c in args.stage_cycles.split(","))

    # bf16: is autocast really active on this device? (matmul output dtype inside the context)
    probe = torch.ones(2, 2, device=runtime.device)
    with autocast(cfg.train.precision, runtime.device):
        autocast_dtype = str((probe @ probe).dtype)

    carry, records = None, []
    for step, cpu_batch in enumerate(batches(args.steps, cfg.train.global_batch_size)):
        started = time.time()
        cycles = stage_cycles if args.stage_at is not None and step >= args.stage_at else (arch.H_cycles, arch.L_cycles)
        set_lr(optimizers, lr_multiplier(step, cfg.optim.warmup_steps, args.steps, cfg.optim.lr_min_ratio))
        exploration = torch.tensor(args.exploration, device=runtime.device)
        batch = runtime.to_device(cpu_batch)
        if carry is None:
            carry = model.initial_carry(batch, carry_dtype(cfg.train.precision))
        before = counters()
        carry, metrics = train_step(
            step_model,
            carry,
            batch,
            exploration,
            cycles,
            optimizers,
            precision=cfg.train.precision,
            loss=cfg.train.loss,
            grad_clip=cfg.train.grad_clip,
            loss_divisor=loss_divisor,
        )
        if ema is not None:
            update_ema(ema, model)
        in_step = counters()  # nothing may have run yet: the step is one lazy graph
        runtime.step_boundary()
        after = counters()
        records.append(
            {
                "step": step,
                "cycles": list(cycles),
                "metrics": metrics.cpu().tolist(),  # after the boundary: a transfer, not a new graph
                "counters": after,
                "in_step": {k: in_step[k] - before[k] for k in in_step},
                "seconds": time.time() - started,
            }
        )
    info = {
        "backend": runtime.backend,
        "world_size": runtime.world_size,
        "loss_divisor": loss_divisor,
        "device": str(runtime.device),
        "autocast_dtype": autocast_dtype,
        "carry_dtype": str(carry.y.dtype),
        "records": records,
    }
    if runtime.backend == "xla":
        import torch_xla
        import torch_xla.runtime as xr

        info["devices"] = xr.global_runtime_device_count()
        info["batch_sharding"] = torch_xla._XLAC._get_xla_sharding_spec(batch["inputs"])
        info["carry_sharding"] = torch_xla._XLAC._get_xla_sharding_spec(carry.z)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    torch.save({"info": info, "params": state}, args.out)
    runtime.close()


if __name__ == "__main__":
    main()
