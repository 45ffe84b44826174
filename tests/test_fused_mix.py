"""train.kernels: the fused MLP-t mix kernel (trm/kernels/fused_mix.py) computes the torch path's values to bf16
rounding, forward and backward, and the choice is resolved and refused as trm/kernel_choice.py says.

On this CPU the Triton kernel runs in Triton's interpreter (the same kernel source the GPU compiles); the GPU
run of the same comparisons is bench/gpu/candidates.py's (docs/benchmarks.md, "Fused kernels")."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from contracts.choices import KERNEL_CHOICES
from trm.kernel_choice import AUTO_CUDA, BF16_TOL, MEASURED_CAPABILITIES, apply_kernels, resolve_kernels
from trm.kernels.fused_mix import mix_sublayer, mix_sublayer_backward
from trm.model import ACTModel, Block, SwiGLU, TRMConfig, rms_norm
from trm.step import autocast

PAPER_SEQ = 97  # Sudoku's 81 cells and the puzzle embedding's 16 positions: arch.total_len of the paper presets


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    ours, reference = ours.detach().double(), reference.detach().double()
    return float((ours - reference).abs().max() / reference.abs().max().clamp_min(1e-30))


def assert_compiled_is_eager(
    fn: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...], grad: torch.Tensor
) -> None:
    """`fn` traced by torch.compile (AOTAutograd, as inductor does) gives eager's value and input gradients, bit for
    bit: a custom op and its registered backward trace as one call each."""
    results = []
    for call in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        leaves = [t.clone().requires_grad_() for t in inputs]
        out = call(*leaves)
        out.backward(grad)
        results.append((out, *(t.grad for t in leaves)))
    for eager, compiled in zip(*results):
        assert compiled is not None and torch.equal(eager, compiled)


def assert_kernel_grads_match(
    block: Block,
    sublayer: SwiGLU,
    forward: Callable[[torch.Tensor], torch.Tensor],
    use_kernels: Callable[[bool], None],
    size: tuple[int, int, int],
    stream: torch.dtype,
) -> None:
    """forward(h).backward(grad_y), h and grad_y of `size` in `stream`, under bf16_reference autocast, on the torch
    path and then with `use_kernels(True)`: h's and `sublayer`'s weight gradients agree to bf16 rounding and are not
    the same bits (the kernels ran)."""
    torch.manual_seed(1)
    h0, grad_y = torch.randn(size).to(stream), torch.randn(size).to(stream)
    grads = {}
    for fused in (False, True):
        use_kernels(fused)
        block.zero_grad(set_to_none=True)
        h = h0.clone().requires_grad_()
        with autocast("bf16_reference", h.device):
            forward(h).backward(grad_y)
        grads[fused] = (h.grad, sublayer.gate_up.weight.grad, sublayer.down.weight.grad)
    for name, mine, theirs in zip(("h", "gate_up", "down"), grads[True], grads[False]):
        assert mine is not None and theirs is not None, name
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, name
        assert relative_error(mine, theirs) < BF16_TOL, name
        assert not torch.equal(mine, theirs), name  # the kernels ran, not the torch path


def shape(mixer: str = "mlp_t", seq: int = PAPER_SEQ, hidden: int = 512) -> TRMConfig:
    """An architecture of that mixer, sequence (total_len, the puzzle embedding's 16 positions included) and width."""
    cfg = TRMConfig(hidden_size=hidden, num_heads=8, expansion=4, L_layers=2, H_cycles=3, L_cycles=6, mixer=mixer)
    cfg.seq_len, cfg.puzzle_emb_len = seq - 16, 16
    return cfg


def mix_block(seq: int, hidden: int, seed: int) -> Block:
    torch.manual_seed(seed)
    cfg = TRMConfig(hidden_size=hidden, num_heads=2, expansion=4, L_layers=1, H_cycles=1, L_cycles=1, mixer="mlp_t")
    cfg.seq_len, cfg.puzzle_emb_len = seq - 4, 4
    return Block(cfg)


@pytest.mark.parametrize(
    ("seq", "hidden", "stream"),
    [(23, 72, torch.bfloat16), (97, 64, torch.bfloat16), (40, 136, torch.float32)],
)
def test_the_kernel_computes_the_torch_sublayer(seq: int, hidden: int, stream: torch.dtype) -> None:
    """Odd sizes: seq padded to a power of two inside, hidden not a multiple of the channel block; a bf16 stream
    (bf16_reference) and an fp32 one (bf16: autocast, fp32 carry)."""
    block = mix_block(seq, hidden, seed=seq)
    h = torch.randn(3, seq, hidden).to(stream)
    with torch.no_grad(), autocast("bf16_reference", h.device):
        torch_path = block.mix_sublayer(h)
        block.fused_mix = "all"
        fused = block.mix_sublayer(h)
    assert fused.dtype == torch_path.dtype == stream
    assert torch.isfinite(fused).all()
    assert relative_error(fused, torch_path) < BF16_TOL
    assert not torch.equal(fused, torch_path)  # the kernel ran, not the torch path
    # The norm runs over the seq axis: every channel of the output has unit mean square, as the torch path's.
    mean_square = fused.float().square().mean(1)
    assert torch.allclose(mean_square, torch.ones_like(mean_square), atol=3e-2)


@pytest.mark.parametrize("stream", [torch.bfloat16, torch.float32])
def test_the_recomputing_backward_is_autograds(stream: torch.dtype) -> None:
    block = mix_block(29, 48, seed=1)
    h = torch.randn(2, 29, 48).to(stream).requires_grad_()
    grad_y = torch.randn(2, 29, 48).to(stream)
    with autocast("bf16_reference", h.device):
        y = block.mix_sublayer(h)  # the torch path (block.fused_mix is off)
    y.backward(grad_y)
    gate_up, down = block.mix.gate_up.weight, block.mix.down.weight
    ours = mix_sublayer_backward(h.detach(), gate_up.bfloat16(), down.bfloat16(), block.eps, grad_y)
    for name, mine, theirs in zip(("h", "gate_up", "down"), ours, (h.grad, gate_up.grad, down.grad)):
        assert theirs is not None
        assert mine.shape == theirs.shape, name
        assert relative_error(mine, theirs) < BF16_TOL, name


def paper_like_model() -> ACTModel:
    torch.manual_seed(0)
    cfg = TRMConfig(
        hidden_size=64, num_heads=2, expansion=4, L_layers=2, H_cycles=2, L_cycles=2, mixer="mlp_t", seq_len=81
    )
    return ACTModel(cfg)


def sudoku_like_batch(size: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "inputs": torch.randint(1, 11, (size, 81), generator=g),
        "labels": torch.randint(2, 11, (size, 81), generator=g),
        "puzzle_identifiers": torch.zeros(size, dtype=torch.long),
    }


STEP_BATCH = 2  # the kernels' grid has a program per puzzle: the interpreter's time is linear in it


def one_step(choice: str, precision: str) -> tuple[float, dict[str, torch.Tensor]]:
    from trm.losses import act_loss
    from trm.step import carry_dtype

    model = paper_like_model().train()
    apply_kernels(model, choice)
    batch = sudoku_like_batch(STEP_BATCH)
    carry = model.initial_carry(batch, carry_dtype(precision))
    with autocast(precision, torch.device("cpu")):
        carry, logits, q_halt = model(carry, batch, 0.0)
    loss, _ = act_loss(logits, q_halt, carry.labels, carry.inputs, carry.halted, carry.steps)
    (loss / STEP_BATCH).backward()
    return float(loss), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@functools.cache
def torch_step(precision: str) -> tuple[float, dict[str, torch.Tensor]]:
    """The torch path's step: the same in every case of a precision, computed once (callers only read it)."""
    return one_step("torch", precision)


@pytest.mark.slow  # a whole model step in Triton's interpreter: 1-25 s a case; the sublayer tests stay fast
@pytest.mark.parametrize(
    ("choice", "precision"),
    [
        ("fused_mix", "bf16_reference"),
        ("fused_mix", "bf16"),
        ("fused_mix_nograd", "bf16_reference"),
        ("fused_mix_nograd", "bf16"),
        ("fused_mix_bwd", "bf16_reference"),  # its fp32 stream: tests/test_fused_mix_backward.py, at sublayer level
        ("fused_mix_swiglu", "bf16_reference"),  # its fp32 stream: tests/test_fused_swiglu.py, at sublayer level
    ],
)
def test_a_training_step_with_a_fused_choice_is_the_torch_step(choice: str, precision: str) -> None:
    """Loss against the torch path's, and every gradient of one step (two H cycles: one without gradients) against
    fp32: the fused choice is no further from fp32 than bf16 rounding takes the torch path (up to 2x: two
    bf16 computations round at different places; the interpreter's runs measured 1.15-1.6x)."""
    loss, grads = one_step(choice, precision)
    torch_loss, torch_grads = torch_step(precision)
    fp32_loss, fp32_grads = torch_step("fp32")
    assert loss == pytest.approx(torch_loss, rel=1e-2)
    assert set(grads) == set(torch_grads) == set(fp32_grads)
    for name in grads:
        rounding = relative_error(torch_grads[name], fp32_grads[name])
        assert relative_error(grads[name], fp32_grads[name]) < max(2 * rounding, BF16_TOL), name


def test_auto_fuses_on_exactly_the_capabilities_bench_results_measured() -> None:
    measured = set()
    for path in (Path(__file__).resolve().parents[1] / "bench" / "results").glob("gpu_candidates_*.json"):
        gpu = json.loads(path.read_text())["machine"]["gpu"]
        if gpu.get("capability"):
            measured.add(tuple(gpu["capability"]))
    assert measured and set(MEASURED_CAPABILITIES) == measured


def test_the_kernel_refuses_weights_of_another_shape() -> None:
    h = torch.randn(1, 10, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"gate_up \[2\*inner, seq\]"):
        mix_sublayer(h, torch.zeros(128, 11, dtype=torch.bfloat16), torch.zeros(10, 64, dtype=torch.bfloat16), 1e-5)


def test_auto_fuses_only_on_a_cuda_gpu_in_bf16_with_mlp_t() -> None:
    assert resolve_kernels("auto", "cuda", "bf16_reference", shape(), (9, 0)).choice == AUTO_CUDA == "fused_mix_swiglu"
    # Every other GPU is unmeasured: Ampere (no TMA), datacenter Blackwell (sm_100), and consumer Blackwell (sm_120,
    # about 100 KB of shared memory: no mix-backward tile fits) take torch's, and name why.
    for capability in ((8, 0), (8, 9), (10, 0), (12, 0)):
        kernels = resolve_kernels("auto", "cuda", "bf16", shape(), capability)
        sm = "sm_{}{}".format(*capability)
        assert kernels.choice == "torch" and f"{sm}: the fused kernels are measured on sm_90 only" in kernels.reason
    unknown = resolve_kernels("auto", "cuda", "bf16", shape())
    assert unknown.choice == "torch" and "compute capability unknown" in unknown.reason
    assert resolve_kernels("fused_mix_nograd", "cuda", "bf16", shape(), (8, 0)).choice == "fused_mix_nograd"
    for device, precision, mixer, why in (
        ("cpu", "bf16_reference", "mlp_t", "the device is cpu"),
        ("xla", "bf16_reference", "mlp_t", "XLA"),
        ("cuda", "fp32", "mlp_t", "resolved to fp32"),
        ("cuda", "bf16", "attention", "arch.mixer=attention"),
    ):
        chosen = resolve_kernels("auto", device, precision, shape(mixer=mixer))
        assert chosen.choice == "torch" and why in chosen.reason, (device, precision, mixer)


def test_impossible_or_unknown_choices_are_refused_with_the_key_and_the_reason() -> None:
    with pytest.raises(ValueError, match=r"train.kernels='cutlass': expected one of \['auto'"):
        resolve_kernels("cutlass", "cuda", "bf16", shape())
    with pytest.raises(ValueError, match="train.kernels=fused_mix: .*resolved to fp32"):
        resolve_kernels("fused_mix", "cuda", "fp32", shape())
    with pytest.raises(ValueError, match="train.kernels=fused_mix_nograd: .*XLA"):
        resolve_kernels("fused_mix_nograd", "xla", "bf16", shape())
    assert resolve_kernels("torch", "cuda", "fp32", shape(mixer="attention")).choice == "torch"
    assert set(KERNEL_CHOICES) == {
        "auto",
        "torch",
        "fused_mix",
        "fused_mix_nograd",
        "fused_mix_bwd",
        "fused_mix_swiglu",
    }
    with pytest.raises(ValueError, match="train.kernels=fused_mix_bwd: .*arch.mixer=attention"):
        resolve_kernels("fused_mix_bwd", "cuda", "bf16", shape(mixer="attention"))


def test_shapes_past_the_tma_blocks_keep_the_torch_path() -> None:
    """The kernels' weight blocks span the padded sequence, at most 256 (a TMA copy's side): `auto` keeps torch for
    a longer one, an explicit fused choice is refused before the model is built, and the kernel itself refuses. The
    kernels copy rows hidden_size wide (h's in the token mixing, x's in the channel SwiGLU): 16-byte aligned, so a
    hidden_size that is no multiple of 8 keeps torch too."""
    chosen = resolve_kernels("auto", "cuda", "bf16", shape(seq=300), (9, 0))
    assert chosen.choice == "torch" and "the sequence (300 positions) pads to 512, over 256" in chosen.reason
    assert resolve_kernels("auto", "cuda", "bf16", shape(seq=256), (9, 0)).choice == AUTO_CUDA
    with pytest.raises(ValueError, match=r"train.kernels=fused_mix_swiglu: .*300 positions\) pads to 512"):
        resolve_kernels("fused_mix_swiglu", "cuda", "bf16", shape(seq=300), (9, 0))
    with pytest.raises(ValueError, match=r"train.kernels=fused_mix_swiglu: .*arch.hidden_size=500 is no multiple of 8"):
        resolve_kernels("fused_mix_swiglu", "cuda", "bf16", shape(hidden=500), (9, 0))
    chosen = resolve_kernels("auto", "cuda", "bf16", shape(hidden=500), (9, 0))
    assert chosen.choice == "torch" and "arch.hidden_size=500 is no multiple of 8" in chosen.reason
    with pytest.raises(ValueError, match=r"train.kernels=fused_mix_nograd: .*arch.hidden_size=500 is no multiple"):
        resolve_kernels("fused_mix_nograd", "cuda", "bf16", shape(hidden=500), (8, 0))
    bf16 = torch.bfloat16
    gate_up, down = torch.zeros(1024, 97, dtype=bf16), torch.zeros(97, 512, dtype=bf16)
    with pytest.raises(ValueError, match=r"fused_mix: arch.hidden_size=12 is no multiple of 8"):
        mix_sublayer(torch.zeros(1, 97, 12, dtype=bf16), gate_up, down, 1e-5)
    h = torch.zeros(1, 300, 8, dtype=torch.bfloat16)
    gate_up, down = torch.zeros(512, 300, dtype=torch.bfloat16), torch.zeros(300, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"fused_mix: the sequence \(300 positions\) pads to 512, over 256"):
        mix_sublayer(h, gate_up, down, 1e-5)


@pytest.mark.slow  # two inductor compiles on a CPU
def test_inductor_rounds_silu_mul_once_and_the_mix_residual_sum_only_with_gradients() -> None:
    """docs/fidelity.md row 16, against the compiled reference: inductor computes silu(gate) * up from the bf16 gate
    and up and rounds once, as the kernels do (eager rounds silu's output too); it keeps the residual sum in fp32
    into the norm in the calls without gradients, and rounds it to bf16 (saved for the backward) in those with."""
    torch.manual_seed(0)
    bf16 = torch.bfloat16
    h, m = torch.randn(8, 64, 97, dtype=bf16), torch.randn(8, 64, 97, dtype=bf16)
    gate, up = torch.randn(2, 8, 97, 256, dtype=bf16)
    once = (gate.float() * torch.sigmoid(gate.float()) * up.float()).to(bf16)
    silu_mul = torch.compile(lambda g, u: torch.nn.functional.silu(g) * u)
    norm = torch.compile(lambda a, b: rms_norm(a + b, 1e-5))
    total = h.float() + m.float()
    unrounded = (total * torch.rsqrt(total.square().mean(-1, keepdim=True) + 1e-5)).to(bf16)
    rounded = rms_norm(h + m, 1e-5)  # eager: the sum stored in bf16
    twice = torch.nn.functional.silu(gate) * up  # eager
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            act = silu_mul(gate.requires_grad_(grad), up)
            y = norm(h.requires_grad_(grad), m)
        # Inductor's fp32 exp and the norm's sum order differ from ATen's: a few elements land an ulp off the
        # matching rounding, a fifth of them off the other.
        assert (act != once).sum() < 1e-4 * act.numel() < (act != twice).sum() / 100, grad
        near, far = (rounded, unrounded) if grad else (unrounded, rounded)
        assert (y != near).sum() < 1e-4 * y.numel() < (y != far).sum() / 100, grad
