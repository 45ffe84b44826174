"""train.kernels=fused_mix_swiglu: the channel SwiGLU's Triton GEMMs (trm/kernels/fused_swiglu.py) compute the torch
path's values and gradients to bf16 rounding, eager and traced by torch.compile. Triton's interpreter runs the kernels
on this CPU; the GPU run of the same comparisons is bench/gpu/candidates.py's."""

from __future__ import annotations

import pytest
import torch

from tests.test_fused_mix import (
    BF16_TOL,
    assert_compiled_is_eager,
    assert_kernel_grads_match,
    mix_block,
    relative_error,
)
from trm.kernels import fused_swiglu, swiglu_gemms
from trm.kernels.fused_swiglu import swiglu, swiglu_saving, swiglu_trainable
from trm.kernels.swiglu_gemms import Tile
from trm.step import autocast


@pytest.mark.parametrize(
    ("tokens", "hidden", "stream"),
    [(2 * 23, 72, torch.bfloat16), (3 * 40, 136, torch.float32), (70, 64, torch.bfloat16)],
)
def test_the_kernel_computes_the_torch_swiglu(tokens: int, hidden: int, stream: torch.dtype) -> None:
    """Odd sizes: tokens not a multiple of the row block, hidden (the dots' K) not a multiple of the K step; a bf16
    stream (bf16_reference) and an fp32 one (bf16, rounded to bf16 inside as autocast does)."""
    block = mix_block(23, hidden, seed=hidden)
    torch.manual_seed(tokens)
    x = torch.randn(tokens, hidden).to(stream)
    with torch.no_grad(), autocast("bf16_reference", x.device):
        torch_path = block.mlp(x)
        block.fused_swiglu = True
        fused = block.channel_mlp(x)
    assert fused.dtype == torch_path.dtype == torch.bfloat16 and fused.shape == x.shape
    assert torch.isfinite(fused).all()
    assert relative_error(fused, torch_path) < BF16_TOL
    assert not torch.equal(fused, torch_path)  # the kernel ran, not the torch path


def test_the_saving_kernel_keeps_the_torch_paths_gate_and_up() -> None:
    block = mix_block(23, 48, seed=3)
    gate_up, down = block.mlp.gate_up.weight.bfloat16(), block.mlp.down.weight.bfloat16()
    x = torch.randn(2, 17, 48, dtype=torch.bfloat16)
    y, gu, act = swiglu_saving(x, gate_up, down)
    assert torch.equal(y, swiglu(x, gate_up, down))  # the same kernel, the same output
    assert gu.shape == (2 * 17, gate_up.shape[0]) and gu.dtype == torch.bfloat16
    assert relative_error(gu, x.reshape(-1, 48) @ gate_up.t()) < BF16_TOL
    gate, up = gu.float().chunk(2, dim=1)  # act: the down product's input, from the saved gate and up
    assert act.shape == (2 * 17, down.shape[1]) and act.dtype == torch.bfloat16
    assert relative_error(act, torch.nn.functional.silu(gate) * up) < BF16_TOL


@pytest.mark.parametrize("stream", [torch.bfloat16, torch.float32])
def test_a_block_with_the_fused_swiglu_differentiates_like_the_torch_path(stream: torch.dtype) -> None:
    block = mix_block(29, 72, seed=1)

    def use_kernels(fused: bool) -> None:
        block.fused_swiglu = fused

    def forward(h: torch.Tensor) -> torch.Tensor:
        return h + block.channel_mlp(h)  # the residual, as trm.model.Block adds it

    assert_kernel_grads_match(block, block.mlp, forward, use_kernels, (2, 29, 72), stream)


def test_a_persistent_grid_computes_what_a_program_per_tile_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tile.per_sm: fewer programs than tiles (2 for 8 here), each looping over every other tile, give the output
    and gradients of one program per tile of the same size, bit for bit."""
    block = mix_block(29, 72, seed=4)  # inner 256: 4 column blocks of 64; 87 tokens: 2 row blocks
    torch.manual_seed(4)
    x0, grad_y = torch.randn(3, 29, 72, dtype=torch.bfloat16), torch.randn(3, 29, 72, dtype=torch.bfloat16)
    gate_up0, down0 = block.mlp.gate_up.weight.detach(), block.mlp.down.weight.detach()
    assert fused_swiglu.grid_size(87, 256, 64, 64, 1, fused_swiglu.INTERPRETER_SMS) == 2
    results = []
    for per_sm in (1, 0):  # persistent first: its buffers cannot be the other run's freed ones
        tile = Tile(64, 64, 64, 4, 3, per_sm)
        monkeypatch.setattr(swiglu_gemms, "TILES", {"forward": (tile,), "backward": (tile._replace(per_sm=0),)})
        x, gate_up, down = (t.clone().requires_grad_() for t in (x0, gate_up0, down0))
        y = swiglu_trainable(x, gate_up.bfloat16(), down.bfloat16())
        y.backward(grad_y)
        results.append((y, x.grad, gate_up.grad, down.grad))
    for name, persistent, one_per_tile in zip(("y", "x", "gate_up", "down"), *results):
        assert persistent is not None and one_per_tile is not None, name
        assert torch.equal(persistent, one_per_tile), name


def test_torch_compile_traces_the_swiglu_ops_and_their_backward() -> None:
    """train.compile traces the custom ops (AOTAutograd, as inductor does; the saved gate/up product and act are
    outputs without a gradient): the same values and gradients as eager, bit for bit."""
    block = mix_block(23, 40, seed=2)
    gate_up0, down0 = block.mlp.gate_up.weight.detach(), block.mlp.down.weight.detach()
    torch.manual_seed(2)
    x0, grad_y = torch.randn(2, 23, 40, dtype=torch.bfloat16), torch.randn(2, 23, 40, dtype=torch.bfloat16)

    def sublayer(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
        return 2 * swiglu_trainable(x * 1, gate_up.bfloat16(), down.bfloat16())

    assert_compiled_is_eager(sublayer, (x0, gate_up0, down0), grad_y)


def test_the_kernel_refuses_weights_of_another_shape() -> None:
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"fused_swiglu: .* inner a multiple of 128"):
        swiglu(x, torch.zeros(200, 8, dtype=torch.bfloat16), torch.zeros(8, 100, dtype=torch.bfloat16))
    odd = torch.randn(4, 12, dtype=torch.bfloat16)  # a hidden size whose rows are not 16-byte aligned
    with pytest.raises(ValueError, match=r"arch.hidden_size=12 is no multiple of 8"):
        swiglu(odd, torch.zeros(256, 12, dtype=torch.bfloat16), torch.zeros(12, 128, dtype=torch.bfloat16))
