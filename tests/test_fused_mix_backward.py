"""train.kernels=fused_mix_bwd: the Triton backward of the fused MLP-t mix sublayer (trm/kernels/fused_mix_backward.py)
computes the recomputing backward's gradients (the same chain rule and bf16 roundings) and autograd's of the torch
path to bf16 rounding, eager and traced by torch.compile. Triton's interpreter runs the kernels on this CPU; the
whole training step with this choice: tests/test_fused_mix.py."""

from __future__ import annotations

from typing import cast

import pytest
import torch

from tests.test_fused_mix import (
    BF16_TOL,
    assert_compiled_is_eager,
    assert_kernel_grads_match,
    mix_block,
    relative_error,
)
from trm.kernels.fused_mix import mix_sublayer, mix_sublayer_backward
from trm.kernels.fused_mix_backward import mix_sublayer_grads, mix_sublayer_saving, mix_sublayer_trainable
from trm.model import SwiGLU
from trm.step import autocast

SAME_ROUNDINGS_TOL = 5e-3  # two sums of the same bf16 products in another order (measured: 3e-3 at most)


@pytest.mark.parametrize(("seq", "hidden", "stream"), [(23, 72, torch.bfloat16), (40, 136, torch.float32)])
def test_the_triton_backward_is_the_recomputing_backward(seq: int, hidden: int, stream: torch.dtype) -> None:
    """Odd sizes (seq padded inside, hidden not a multiple of the channel block); a bf16 stream (bf16_reference)
    and an fp32 one (bf16)."""
    block = mix_block(seq, hidden, seed=seq)
    gate_up, down = block.mix.gate_up.weight.bfloat16(), block.mix.down.weight.bfloat16()
    torch.manual_seed(seq)
    h, grad_y = torch.randn(2, seq, hidden).to(stream), torch.randn(2, seq, hidden).to(stream)
    y, total = mix_sublayer_saving(h, gate_up, down, block.eps)
    assert torch.equal(y, mix_sublayer(h, gate_up, down, block.eps))  # the same kernel, the same output
    with torch.no_grad(), autocast("bf16_reference", h.device):
        torch_total = h.transpose(1, 2) + block.mix(h.transpose(1, 2))  # the sum the norm normalizes
    assert total.dtype == stream and relative_error(total, torch_total.transpose(1, 2)) < BF16_TOL
    ours = mix_sublayer_grads(h, total, grad_y, gate_up, down, block.eps)
    recomputed = mix_sublayer_backward(h, gate_up, down, block.eps, grad_y)
    for name, mine, theirs in zip(("h", "gate_up", "down"), ours, recomputed):
        assert mine.shape == theirs.shape and mine.dtype == theirs.dtype, name
        assert torch.isfinite(mine).all(), name
        assert relative_error(mine, theirs) < SAME_ROUNDINGS_TOL, name


@pytest.mark.parametrize("stream", [torch.bfloat16, torch.float32])
def test_a_block_with_the_triton_backward_differentiates_like_the_torch_path(stream: torch.dtype) -> None:
    block = mix_block(29, 48, seed=1)

    def use_kernels(fused: bool) -> None:
        block.fused_mix = "all_bwd" if fused else "off"

    assert_kernel_grads_match(block, cast(SwiGLU, block.mix), block.mix_sublayer, use_kernels, (2, 29, 48), stream)


def test_torch_compile_traces_the_saving_op_and_its_backward() -> None:
    """train.compile traces the custom ops (AOTAutograd, as inductor does; the residual sum is an output without a
    gradient): the same values and gradients as eager, bit for bit."""
    block = mix_block(23, 40, seed=2)
    gate_up0, down0 = block.mix.gate_up.weight.detach(), block.mix.down.weight.detach()
    torch.manual_seed(2)
    h0, grad_y = torch.randn(2, 23, 40, dtype=torch.bfloat16), torch.randn(2, 23, 40, dtype=torch.bfloat16)

    def sublayer(h: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
        return 2 * mix_sublayer_trainable(h * 1, gate_up.bfloat16(), down.bfloat16(), block.eps)

    assert_compiled_is_eager(sublayer, (h0, gate_up0, down0), grad_y)
