"""AdamW and Lion on XLA (trm/xla_optim.py: their scalars as device data) against the libraries on the CPU.

One process (tests/xla/_lane.py: a fresh one, 1 virtual device) runs 6 steps of each optimizer, with weight decay
and an lr that changes every step, on XLA parameters and on CPU copies of them with torch.optim.AdamW /
lion_pytorch.Lion, and reports how far apart they end; then a second run of each with other lr, weight decay
(among them exactly 0), betas (and eps), whose steps must all be found in the in-memory graph cache."""

from __future__ import annotations

import json
import textwrap

import pytest
from _lane import run_python, xla_env

SCRIPT = textwrap.dedent(
    """
    import json
    import lion_pytorch
    import torch
    import torch_xla
    import torch_xla.debug.metrics as met
    from trm.xla_optim import AdamW, Lion

    dev = torch_xla.device()
    LIBRARY = {"adamw": torch.optim.AdamW, "lion": lion_pytorch.Lion}
    OURS = {"adamw": AdamW, "lion": Lion}
    SETTINGS = {
        "adamw": [
            dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=1.0),
            dict(lr=7e-4, betas=(0.85, 0.99), eps=1e-6, weight_decay=0.37),
            dict(lr=1.1e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0),
        ],
        "lion": [
            dict(lr=3e-4, betas=(0.9, 0.99), weight_decay=3.0),
            dict(lr=1e-4, betas=(0.95, 0.98), weight_decay=0.37),
            dict(lr=1e-4, betas=(0.9, 0.95), weight_decay=0.0),
        ],
    }
    STEPS = 6

    def count(name):
        return met.counter_value(name) or 0

    def run(name, settings, seed):
        gen = torch.Generator().manual_seed(seed)
        init = [torch.randn(8, 5, generator=gen), torch.randn(5, generator=gen) * 0.1]
        grads = [[torch.randn(p.shape, generator=gen) for p in init] for _ in range(STEPS)]
        cpu = [torch.nn.Parameter(p.clone()) for p in init]
        xla = [torch.nn.Parameter(p.clone().to(dev)) for p in init]
        optimizers = [LIBRARY[name](cpu, **settings), OURS[name](xla, **settings)]
        compiles, syncs = count("UncachedCompile"), count("aten::_local_scalar_dense")
        for step, step_grads in enumerate(grads):
            for opt, params in zip(optimizers, (cpu, xla)):
                for group in opt.param_groups:
                    group["lr"] = settings["lr"] * (step + 1) / STEPS  # a warmup, as trm.optim.set_lr
                for p, g in zip(params, step_grads):
                    p.grad = g.clone().to(p.device)
                opt.step()
            torch_xla.sync()
        error = max(float((x.cpu() - c).abs().max() / c.abs().max()) for x, c in zip(xla, cpu))
        # the same, relative to how far the steps moved the weights (the library's update)
        update_error = max(float((x.cpu() - c).abs().max() / (c - p).abs().max()) for x, c, p in zip(xla, cpu, init))
        moved = min(float((c - p).abs().max() / p.abs().max()) for c, p in zip(cpu, init))
        new_compiles = count("UncachedCompile") - compiles
        return dict(error=error, update_error=update_error, moved=moved, compiles=new_compiles, syncs=count("aten::_local_scalar_dense") - syncs)

    print(json.dumps({name: [run(name, s, seed) for seed, s in enumerate(SETTINGS[name])] for name in SETTINGS}))
    """
)


@pytest.fixture(scope="module")
def runs() -> dict[str, list[dict[str, float]]]:
    proc = run_python(["-c", SCRIPT], xla_env(1), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["adamw", "lion"])
def test_the_xla_update_matches_the_library_on_the_cpu(runs: dict, name: str) -> None:
    for run in runs[name]:
        assert run["moved"] > 1e-4, run  # the steps changed the weights: the comparison is not of no-ops
        assert run["error"] < 1e-6, run  # relative to the weights (measured: 1.5e-8 for AdamW's first, else 0)
        assert run["update_error"] < 1e-5, run  # relative to what the steps moved them (3.4e-7, else 0)
        assert run["syncs"] == 0, run  # no scalar read back from the device


@pytest.mark.parametrize("name", ["adamw", "lion"])
def test_other_lr_weight_decay_and_betas_compile_nothing_new(runs: dict, name: str) -> None:
    first, *others = runs[name]
    assert first["compiles"] >= 1, first  # the counter does see compiles
    for run in others:  # other values, weight decay 0 included: every graph is the first run's
        assert run["compiles"] == 0, runs[name]
