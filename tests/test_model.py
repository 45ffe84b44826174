"""The TRM network, its ACT wrapper, the loss and the FLOP count."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from contracts.hydra_app import compose_train_config
from tests.config_blocks import block
from trm.flops import flops_per_sample_step
from trm.losses import IGNORE_INDEX, METRIC_KEYS, act_loss, log_stablemax, normalize_metrics, token_cross_entropy
from trm.model import ACTModel, TRMConfig, count_params

PAPER = dict(hidden_size=512, num_heads=8, expansion=4, L_layers=2, H_cycles=3, L_cycles=6, puzzle_emb_len=16)
SMALL = dict(
    hidden_size=32, num_heads=2, expansion=2, L_layers=1, H_cycles=2, L_cycles=2, puzzle_emb_len=1, halt_max_steps=4
)


def batch(size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "inputs": torch.randint(1, 11, (size, 81), generator=g),
        "labels": torch.randint(2, 11, (size, 81), generator=g),
        "puzzle_identifiers": torch.zeros(size, dtype=torch.long),
    }


@pytest.mark.parametrize(
    "mixer,pos,expected_millions",
    [("mlp_t", "none", 5.03), ("attention", "rope", 6.83)],
)
def test_paper_parameter_counts(mixer: str, pos: str, expected_millions: float) -> None:
    counts = count_params(ACTModel(TRMConfig(**PAPER, mixer=mixer, pos_encodings=pos)))
    assert round(counts["params"] / 1e6, 2) == expected_millions
    assert counts["puzzle_emb_params"] == 512  # one identifier for Sudoku, trained by SignSGD


def test_paper_presets_match_paper_configs() -> None:
    for preset, mixer in (("trm_mlp_t_sudoku", "mlp_t"), ("trm_att_sudoku", "attention")):
        arch = compose_train_config([f"arch={preset}"]).arch
        assert (arch.hidden_size, arch.L_layers, arch.H_cycles, arch.L_cycles, arch.mixer) == (512, 2, 3, 6, mixer)
        assert arch.halt_max_steps == 16 and arch.puzzle_emb_len == 16


@pytest.mark.parametrize("mixer,pos", [("attention", "rope"), ("mlp_t", "none"), ("attention", "learned")])
def test_forward_shapes_and_gradients(mixer: str, pos: str) -> None:
    model = ACTModel(TRMConfig(**SMALL, mixer=mixer, pos_encodings=pos))
    data = batch(3)
    carry = model.initial_carry(data)
    carry, logits, q_halt = model(carry, data, 0.0)
    assert logits.shape == (3, 81, 11) and q_halt.shape == (3,)
    loss, metrics = act_loss(logits, q_halt, carry.labels, carry.inputs, carry.halted, carry.steps)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert metrics.shape == (len(METRIC_KEYS),)


def test_carry_keeps_unhalted_slots_and_refills_halted_ones() -> None:
    torch.manual_seed(0)
    model = ACTModel(TRMConfig(**SMALL)).train()
    first, second = batch(4, seed=1), batch(4, seed=2)
    carry = model.initial_carry(first)
    carry, _, _ = model(carry, first, 0.0)
    assert torch.equal(carry.inputs, first["inputs"])  # every slot loaded on the first step
    assert (carry.steps == 1).all()
    # Force slots 0 and 2 to have halted: they must take the new batch; 1 and 3 keep their puzzle.
    carry = carry._replace(halted=torch.tensor([True, False, True, False]))
    carry, _, _ = model(carry, second, 0.0)
    assert torch.equal(carry.inputs[[0, 2]], second["inputs"][[0, 2]])
    assert torch.equal(carry.inputs[[1, 3]], first["inputs"][[1, 3]])
    assert carry.steps.tolist() == [1, 2, 1, 2]


def test_training_halts_at_most_at_halt_max_steps_and_eval_runs_all_steps() -> None:
    torch.manual_seed(0)
    model = ACTModel(TRMConfig(**SMALL))
    data = batch(8)
    model.eval()
    carry = model.initial_carry(data)
    for step in range(1, 5):
        carry, _, _ = model(carry, data, 1.0)
        assert bool(carry.halted.all()) == (step == 4)  # eval: no early halting, whatever Q says
    model.train()
    with torch.no_grad():
        model.inner.q_head.bias.fill_(5.0)  # Q-halt says "halt now" everywhere
    carry = model.initial_carry(data)
    carry, _, _ = model(carry, data, 0.0)
    assert carry.halted.all()  # no exploration: halts after one step
    carry = model.initial_carry(data)
    carry, _, _ = model(carry, data, 1.0)
    assert not carry.halted.any()  # exploration forces a minimum of >= 2 steps


def test_stablemax_is_a_distribution_with_finite_gradients() -> None:
    logits = torch.tensor([[-3.0, 0.0, 1.0, 4.0]], requires_grad=True)
    logp = log_stablemax(logits)
    assert torch.allclose(logp.exp().sum(), torch.tensor(1.0))
    s = torch.tensor([1 / 4, 1.0, 2.0, 5.0])
    assert torch.allclose(logp.exp(), (s / s.sum()).unsqueeze(0))
    logp[0, 2].backward()
    assert torch.isfinite(logits.grad).all()


def test_ignored_labels_cost_nothing_and_softmax_option() -> None:
    logits = torch.randn(2, 81, 11)
    labels = torch.randint(2, 11, (2, 81))
    labels[1] = IGNORE_INDEX
    for kind in ("stablemax", "softmax"):
        per_token = token_cross_entropy(logits, labels, kind)
        assert (per_token[1] == 0).all() and (per_token[0] > 0).all()
    with pytest.raises(ValueError, match="train.loss='hinge'"):
        token_cross_entropy(logits, labels, "hinge")


def test_metrics_count_halted_puzzles_only() -> None:
    labels = torch.full((3, 81), 5)
    inputs = torch.full((3, 81), 5)
    inputs[:, :10] = 1  # ten blanks
    logits = torch.zeros(3, 81, 11)
    logits[..., 5] = 10.0  # predicts the answer everywhere ...
    logits[1, 0, 5] = -10.0  # ... except one blank cell of puzzle 1
    halted = torch.tensor([True, True, False])
    steps = torch.tensor([3, 4, 1])
    q_halt = torch.tensor([2.0, 2.0, -2.0])
    _, sums = act_loss(logits, q_halt, labels, inputs, halted, steps)
    m = normalize_metrics(sums.tolist(), "train")
    assert m["train/halted_examples"] == 2 and "train/count" not in m
    assert m["train/exact_accuracy"] == pytest.approx(0.5)
    assert m["train/accuracy"] == pytest.approx((1 + 80 / 81) / 2)
    assert m["train/blank_accuracy"] == pytest.approx((1 + 9 / 10) / 2)
    assert m["train/q_halt_accuracy"] == pytest.approx(0.5)  # puzzle 1 said "halt, correct" but was wrong
    assert m["train/steps"] == pytest.approx(3.5)


def test_losses_are_divided_as_the_reference_divides_them() -> None:
    """Train losses per example (the reference: per global batch), eval losses per halted labelled example (the
    reference's eval divides every metric by its count): same names, same meanings. A row without labels (not
    in Sudoku) makes the two divisors differ."""
    labels = torch.full((3, 81), 5)
    labels[2] = IGNORE_INDEX  # no labelled cell: never counted
    inputs = torch.full((3, 81), 5)
    logits = torch.randn(3, 81, 11, generator=torch.Generator().manual_seed(0))
    halted = torch.tensor([True, True, True])
    _, sums = act_loss(logits, torch.zeros(3), labels, inputs, halted, torch.ones(3))
    values = dict(zip(METRIC_KEYS, sums.tolist()))
    train, evaluation = normalize_metrics(sums.tolist(), "train"), normalize_metrics(sums.tolist(), "eval")
    for loss in ("lm_loss", "q_halt_loss"):
        assert train[f"train/{loss}"] == pytest.approx(values[loss] / 3)
        assert evaluation[f"eval/{loss}"] == pytest.approx(values[loss] / 2)
    assert train["train/halted_examples"] == evaluation["eval/halted_examples"] == 2


@pytest.mark.slow
def test_flops_grow_with_recursion_depth() -> None:
    arch = TRMConfig(**SMALL)
    base = flops_per_sample_step(arch, 2, 2)
    deeper = flops_per_sample_step(arch, 3, 2)
    assert 0 < base < deeper
    # one more no-grad H cycle adds exactly its forward: (L_cycles + 1) net applications
    assert deeper - base == pytest.approx((flops_per_sample_step(arch, 4, 2) - deeper), rel=1e-6)


@pytest.mark.parametrize("mixer", ["attention", "mlp_t"])
def test_meta_device_flop_count_equals_a_real_step(mixer: str) -> None:
    """trm.info counts on the meta device (no arithmetic): it sees the ops of a real CPU step, plus attention's
    two products, which a real CPU step hides in the fused flash kernel FlopCounterMode does not count."""
    from torch.utils.flop_counter import FlopCounterMode

    arch = TRMConfig(**SMALL, mixer=mixer)
    h_cycles, l_cycles = 3, 2
    model = ACTModel(arch)
    b = batch(1)
    carry = model.initial_carry(b)
    with FlopCounterMode(display=False) as counter:
        carry, logits, q_halt = model(carry, b, 0.0, h_cycles, l_cycles)
        loss, _ = act_loss(logits, q_halt, carry.labels, carry.inputs, carry.halted, carry.steps)
        loss.backward()
    attention = 0
    if mixer == "attention":  # QK^T and AV: 4 S^2 d per layer forward, twice that backward (last H cycle only)
        seq, calls_per_cycle = arch.total_len, (l_cycles + 1) * arch.L_layers
        attention = 4 * seq**2 * arch.hidden_size * calls_per_cycle * (h_cycles + 2)
    assert flops_per_sample_step(arch, h_cycles, l_cycles) == counter.get_total_flops() + attention > 0


@pytest.mark.slow
def test_info_cli_prints_one_json_line() -> None:
    out = (
        subprocess.run(
            [sys.executable, "-m", "trm.info", "arch=trm_mlp_t_sudoku"], capture_output=True, text=True, check=True
        )
        .stdout.strip()
        .splitlines()
    )
    assert len(out) == 1
    info = json.loads(out[0])
    assert round(info["params"] / 1e6, 2) == 5.03
    assert info["flops_per_sample_step"] > 6 * info["params"] * 97  # recursion: far more than one pass


def test_auto_position_encoding_follows_the_mixer() -> None:
    assert TRMConfig(**SMALL, mixer="attention").pos_encodings == "rope"
    assert TRMConfig(**SMALL, mixer="mlp_t").pos_encodings == "none"
    assert TRMConfig(**SMALL, mixer="attention", pos_encodings="learned").pos_encodings == "learned"
    with pytest.raises(ValueError, match=r"arch.pos_encodings='alibi'"):
        TRMConfig(**SMALL, pos_encodings="alibi")


def test_puzzle_emb_ndim_0_means_no_puzzle_embedding_as_in_the_reference() -> None:
    """A reference config with `puzzle_emb_ndim: 0, puzzle_emb_len: 0` trains a model without a puzzle table or
    prefix (0 used to become the hidden size here); tests/test_fidelity.py compares its forward with the
    reference's."""
    from trm.optim import build_optimizers

    arch = TRMConfig(**{**SMALL, "puzzle_emb_len": 0}, puzzle_emb_ndim=0)
    assert arch.puzzle_emb_len == 0 and arch.total_len == 81
    model = ACTModel(arch).train()
    assert count_params(model)["puzzle_emb_params"] == 0 and model.inner.puzzle_emb is None
    optimizers = build_optimizers(model, block("optim", "experiment=test_tiny"))
    assert len(optimizers) == 1  # no SignSGD without a table
    data = batch(3)
    carry, logits, q_halt = model(model.initial_carry(data), data, 0.0)
    assert carry.y.shape == (3, 81, 32) and logits.shape == (3, 81, 11)
    loss, _ = act_loss(logits, q_halt, carry.labels, carry.inputs, carry.halted, carry.steps)
    loss.backward()
    before = model.inner.lm_head.weight.detach().clone()
    optimizers[0].step()
    assert not torch.equal(before, model.inner.lm_head.weight)


@pytest.mark.parametrize("ndim,expected_len", [(None, 1), (32, 1), (33, 2), (64, 2), (100, 4)])
def test_puzzle_emb_len_0_is_derived_from_the_width_as_in_the_reference(ndim: int | None, expected_len: int) -> None:
    arch = TRMConfig(**{**SMALL, "puzzle_emb_len": 0}, puzzle_emb_ndim=ndim)  # hidden 32: ceil(ndim / 32)
    assert arch.puzzle_emb_len == expected_len
    data = batch(2)
    carry, logits, _ = ACTModel(arch)(ACTModel(arch).initial_carry(data), data, 0.0)
    assert carry.y.shape[1] == 81 + expected_len and logits.shape == (2, 81, 11)


@pytest.mark.parametrize(
    "values,message",
    [
        (
            {"puzzle_emb_ndim": 0, "puzzle_emb_len": 16},
            r"puzzle_emb_ndim=0 .*puzzle_emb_len=16.*set arch.puzzle_emb_len=0",
        ),
        ({"puzzle_emb_ndim": -1}, r"arch.puzzle_emb_ndim=-1: must be >= 0"),
        ({"puzzle_emb_len": -2}, r"arch.puzzle_emb_len=-2: must be >= 0"),
        ({"puzzle_emb_ndim": 65, "puzzle_emb_len": 2}, r"puzzle_emb_ndim=65 does not fit in arch.puzzle_emb_len=2"),
    ],
)
def test_puzzle_prefix_settings_the_reference_cannot_run_are_refused(values: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TRMConfig(**{**SMALL, **values})


def test_q_continue_is_refused_in_one_line_not_ignored() -> None:
    """The reference's `no_ACT_continue: false` trains a Q-continue head we do not compute: refused, naming it;
    its default (true) is accepted, so a reference arch config with the key set loads."""
    assert TRMConfig.from_dict({**SMALL, "no_ACT_continue": True}).no_ACT_continue
    with pytest.raises(ValueError, match=r"arch.no_ACT_continue=False: the reference's Q-continue head") as err:
        TRMConfig.from_dict({**SMALL, "no_ACT_continue": False})
    assert "\n" not in str(err.value)
