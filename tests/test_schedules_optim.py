"""Schedules are pure functions of progress; optimizers are built as the reference runs them."""

from __future__ import annotations

import math

import pytest
import torch
from lion_pytorch import Lion

from contracts.train_config import CurriculumConfig, HaltingConfig
from tests.config_blocks import block
from trm import xla_optim
from trm.adam_atan2 import AdamAtan2, device_scalars
from trm.model import ACTModel, TRMConfig
from trm.optim import SignSGD, build_ema, build_optimizers, lr_multiplier, set_lr, update_ema
from trm.schedules import curriculum_stage, exploration_at, recursion_at, validate_curriculum


def curriculum(**kw) -> CurriculumConfig:
    base = dict(enabled=True, start_H_cycles=1, start_L_cycles=2, end_fraction=0.5, stages=3)
    return CurriculumConfig(**{**base, **kw})  # its schema's checks run here, as TrainJob.of runs them


def test_curriculum_values_at_progress() -> None:
    cfg = curriculum()
    # stages: [0, 0.25) start, [0.25, 0.5) middle, >= 0.5 the arch values (H 3, L 6)
    assert recursion_at(0.0, cfg, 3, 6) == (1, 2)
    assert recursion_at(0.2499, cfg, 3, 6) == (1, 2)
    assert recursion_at(0.25, cfg, 3, 6) == (2, 4)
    assert recursion_at(0.4999, cfg, 3, 6) == (2, 4)
    assert recursion_at(0.5, cfg, 3, 6) == (3, 6)
    assert recursion_at(0.99, cfg, 3, 6) == (3, 6)
    assert [curriculum_stage(p / 100, cfg) for p in range(0, 100, 10)] == [0, 0, 0, 1, 1, 2, 2, 2, 2, 2]
    assert recursion_at(0.0, curriculum(enabled=False), 3, 6) == (3, 6)


def test_curriculum_changes_value_only_at_stage_boundaries() -> None:
    cfg = curriculum(stages=4, end_fraction=0.8)
    values = [recursion_at(i / 1000, cfg, 3, 6) for i in range(1000)]
    changes = sum(a != b for a, b in zip(values, values[1:]))
    assert changes == 3  # stages - 1 changes: one recompile each on XLA


def test_invalid_curriculum_names_the_key() -> None:
    with pytest.raises(ValueError, match=r"curriculum.start_H_cycles=5"):
        validate_curriculum(curriculum(start_H_cycles=5), 3, 6)
    with pytest.raises(ValueError, match=r"curriculum.stages=1"):
        validate_curriculum(curriculum(stages=1), 3, 6)
    with pytest.raises(ValueError, match=r"curriculum.end_fraction=1.5"):
        validate_curriculum(curriculum(end_fraction=1.5), 3, 6)


def test_exploration_schedule() -> None:
    fixed = HaltingConfig(exploration_prob=0.1, adaptive=False, final_exploration_prob=0.0, decay_end_fraction=1.0)
    assert exploration_at(0.0, fixed) == exploration_at(0.9, fixed) == pytest.approx(0.1)
    adaptive = HaltingConfig(exploration_prob=0.5, adaptive=True, final_exploration_prob=0.1, decay_end_fraction=0.8)
    assert exploration_at(0.0, adaptive) == pytest.approx(0.5)
    assert exploration_at(0.4, adaptive) == pytest.approx(0.3)
    assert exploration_at(0.8, adaptive) == pytest.approx(0.1)
    assert exploration_at(1.0, adaptive) == pytest.approx(0.1)


def test_lr_schedule_warmup_never_zero_then_cosine() -> None:
    # Update `step` (0-based) uses the reference's schedule at its 1-based update count n = step + 1.
    assert lr_multiplier(0, 100, 1000, 0.1) == pytest.approx(0.01)  # never 0: the first update has lr / warmup
    assert lr_multiplier(49, 100, 1000, 0.1) == pytest.approx(0.5)
    assert lr_multiplier(99, 100, 1000, 0.1) == pytest.approx(1.0)  # n = warmup: the cosine's top
    assert lr_multiplier(549, 100, 1000, 0.1) == pytest.approx(0.55)  # n = 550: halfway down the cosine
    assert lr_multiplier(999, 100, 1000, 0.1) == pytest.approx(0.1)
    assert lr_multiplier(700, 100, 1000, 1.0) == pytest.approx(1.0)  # min ratio 1: constant


def test_lr_schedule_is_not_one_step_behind_the_reference() -> None:
    """The reference's cosine at update n is min + (1 - min) * (1 + cos(pi * (n - W) / (T - W))) / 2; a schedule
    evaluated at the 0-based index (the old code) lags it by one update."""
    warmup, total, low = 10, 50, 0.2
    for step in range(total):
        n = step + 1
        if n < warmup:
            expected = n / warmup
        else:
            expected = low + (1 - low) * 0.5 * (1 + math.cos(math.pi * (n - warmup) / (total - warmup)))
        assert lr_multiplier(step, warmup, total, low) == pytest.approx(expected, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("name,cls", [("adam_atan2", AdamAtan2), ("adamw", torch.optim.AdamW), ("lion", Lion)])
def test_each_optimizer_config_builds(name: str, cls: type) -> None:
    optim = block("optim", f"optim={name}", "experiment=paper_sudoku", "data.path=unused")
    model = ACTModel(
        TRMConfig(hidden_size=16, num_heads=2, expansion=2, L_layers=1, H_cycles=1, L_cycles=1, puzzle_emb_len=1)
    )
    main, emb = build_optimizers(model, optim)
    assert isinstance(main, cls) and isinstance(emb, SignSGD)
    assert main.param_groups[0]["weight_decay"] == optim.weight_decay
    set_lr([main, emb], 0.5)
    assert main.param_groups[0]["lr"] == pytest.approx(optim.lr * 0.5)
    emb_params = {id(p) for p in emb.param_groups[0]["params"]}
    assert emb_params == {id(model.inner.puzzle_emb.weight)}


@pytest.mark.parametrize(
    "library,ours,settings",
    [
        (torch.optim.AdamW, xla_optim.AdamW, dict(lr=3e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.37)),
        (torch.optim.AdamW, xla_optim.AdamW, dict(lr=1e-3, betas=(0.85, 0.95), eps=1e-6, weight_decay=0.0)),
        (Lion, xla_optim.Lion, dict(lr=3e-4, betas=(0.9, 0.99), weight_decay=3.0)),
        (Lion, xla_optim.Lion, dict(lr=1e-4, betas=(0.95, 0.98), weight_decay=0.0)),
    ],
)
def test_adamw_and_lion_with_scalars_as_data_match_the_libraries(
    library: type, ours: type, settings: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """trm/xla_optim.py: off XLA the libraries' own step (bit for bit); its XLA update (forced on here, on the CPU,
    with the scalars as tensors) the same numbers to 1e-6 of the weights, over steps with weight decay and an lr
    that changes every step (set_lr's warmup)."""
    uploads: list[tuple[float, ...]] = []

    def counted(like: torch.Tensor, *values: float) -> tuple[torch.Tensor, ...]:
        uploads.append(values)
        return device_scalars(like, *values)

    monkeypatch.setattr(xla_optim, "device_scalars", counted)
    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(8, 5, generator=gen), torch.randn(5, generator=gen) * 0.1]
    grads = [[torch.randn(p.shape, generator=gen) for p in init] for _ in range(6)]
    runs = {}
    for name, make in [
        ("library", library),
        ("default", ours),
        ("as_data", lambda params, **kw: ours(params, **kw, scalars_as_data=True)),
    ]:
        params = [torch.nn.Parameter(p.clone()) for p in init]
        opt = make(params, **settings)
        for step, step_grads in enumerate(grads):
            for group in opt.param_groups:
                group["lr"] = settings["lr"] * (step + 1) / len(grads)
            for p, g in zip(params, step_grads):
                p.grad = g.clone()
            opt.step()
        runs[name] = [p.detach() for p in params]
        assert len(uploads) == (len(grads) if name == "as_data" else 0), name  # one upload per step: the data path
        uploads.clear()
    for p, lib, default, as_data in zip(init, runs["library"], runs["default"], runs["as_data"]):
        assert (lib - p).abs().max() > 1e-4 * p.abs().max()  # the steps moved the weights
        assert torch.equal(default, lib)
        assert (as_data - lib).abs().max() <= 1e-6 * lib.abs().max()


def test_sign_sgd_decays_only_touched_rows() -> None:
    table = torch.nn.Parameter(torch.ones(3, 4))
    opt = SignSGD([table], lr=0.1, weight_decay=1.0)
    table.grad = torch.zeros(3, 4)
    table.grad[1] = torch.tensor([2.0, -3.0, 0.5, -0.1])
    opt.step()
    assert torch.equal(table.data[0], torch.ones(4)) and torch.equal(table.data[2], torch.ones(4))
    assert torch.allclose(table.data[1], torch.tensor([0.8, 1.0, 0.8, 1.0]))  # 1*(1-0.1) -+ 0.1


def test_ema_starts_from_the_initial_weights() -> None:
    """As the reference's: after one step the average is decay * initial + (1 - decay) * new, not a copy of new."""
    model = torch.nn.Linear(2, 2)
    initial = model.weight.detach().clone()
    ema = build_ema(model, 0.5)
    with torch.no_grad():
        model.weight.add_(2.0)
    update_ema(ema, model)
    assert torch.allclose(ema.module.weight, initial + 1.0)
    with torch.no_grad():
        model.weight.add_(2.0)
    update_ema(ema, model)
    assert torch.allclose(ema.module.weight, initial + 2.5)


def test_ema_does_not_average_the_puzzle_embedding() -> None:
    model = ACTModel(
        TRMConfig(hidden_size=16, num_heads=2, expansion=2, L_layers=1, H_cycles=1, L_cycles=1, puzzle_emb_len=1)
    )
    ema = build_ema(model, 0.9)
    with torch.no_grad():
        model.inner.puzzle_emb.weight.fill_(3.0)
        model.inner.lm_head.weight.fill_(3.0)
    update_ema(ema, model)
    assert torch.equal(ema.module.inner.puzzle_emb.weight, model.inner.puzzle_emb.weight)  # the live table
    assert not torch.allclose(ema.module.inner.lm_head.weight, model.inner.lm_head.weight)  # averaged
