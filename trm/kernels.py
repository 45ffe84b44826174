"""`train.kernels`: which kernels run MLP-t's token-mixing sublayer and, with `fused_mix_swiglu`, the channel SwiGLU
(`auto` keeps torch's on a CPU and on XLA).

- `torch`: the model's torch ops (under train.compile, what inductor makes of them).
- `fused_mix`: the sublayer as one Triton kernel (trm/fused_mix.py) in every call; the calls that carry gradients
  recompute it in torch ops in the backward.
- `fused_mix_bwd`: the kernel in every call, and in the calls with gradients a Triton backward
  (trm/fused_mix_backward.py: the forward keeps the residual sum; no recompute of the forward's output).
- `fused_mix_swiglu`: `fused_mix_bwd`, and the channel SwiGLU's silu*mul inside its GEMMs (trm/fused_swiglu.py),
  forward and backward, in every call.
- `fused_mix_nograd`: the kernel only in the calls without gradients (TRM's H_cycles - 1 no-grad cycles, and eval);
  the calls with gradients keep the torch path.
- `auto` (the default): `AUTO_CUDA` on a CUDA GPU of a compute capability the kernels were measured on
  (MEASURED_CAPABILITIES: sm_90, the lent H100; docs/benchmarks.md, "Fused kernels") with Triton, when the precision
  is bf16, the mixer mlp_t, the sequence within the kernels' TMA blocks and arch.hidden_size a multiple of 8 (rows
  a TMA copy can take); else `torch`. Elsewhere the fused choices are unmeasured: below Hopper Triton compiles their
  TMA copies to plain loads that spill registers in every tile (bench/triton_sm90.py --capability 80), and a newer
  GPU may lack the shared memory the mix-backward tiles take (consumer Blackwell, sm_120, has about 100 KB); they
  stay explicit choices there.

The kernel computes in bf16 (its dots take bf16 operands as autocast's do), so an explicit fused choice with fp32,
without Triton, or on XLA is refused with the reason before the model is built. On a CPU a fused choice needs Triton's
interpreter (TRITON_INTERPRET=1): correct and slow, the tests' way to check the kernel against the torch path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from contracts.choices import AUTO, check_kernels_choice

if TYPE_CHECKING:
    from trm.model import ACTModel, Block
    from trm.model_config import TRMConfig

# choice -> trm.model.Block.fused_mix
FUSED = {"fused_mix": "all", "fused_mix_nograd": "nograd", "fused_mix_bwd": "all_bwd", "fused_mix_swiglu": "all_bwd"}
FUSED_SWIGLU = ("fused_mix_swiglu",)  # choices that also set trm.model.Block.fused_swiglu
AUTO_CUDA = "fused_mix_swiglu"  # the fastest on an H100 (docs/benchmarks.md, "Fused kernels")
# How far a fused choice's values may be from the torch path's (relative to the largest): bf16 keeps 8 bits, and
# two computations of the same function differ by a few units of 2^-8 (the tests and bench/gpu_candidates.py).
BF16_TOL = 2e-2
# The compute capabilities the fused kernels were measured on (bench/results/gpu_candidates_*.json: test_fused_mix
# keeps the two equal); `auto` picks them only there.
MEASURED_CAPABILITIES = ((9, 0),)
BF16_PRECISIONS = ("bf16", "bf16_reference")


class Kernels(NamedTuple):
    """The concrete choice (one of KERNEL_CHOICES but auto) and why it was made."""

    choice: str
    reason: str


def resolve_kernels(
    requested: object, device_type: str, precision: str, arch: TRMConfig, capability: tuple[int, int] | None = None
) -> Kernels:
    """The concrete choice for `train.kernels=requested` on this device (a CUDA device's compute `capability`),
    resolved precision and architecture (its mixer, the sequence the token mixing spans, the hidden size)."""
    from trm import fused_mix

    choice = check_kernels_choice(requested)
    too_long, misaligned = fused_mix.too_long(arch.total_len), fused_mix.misaligned(arch.hidden_size)
    blockers = [
        why
        for why, blocked in (
            (f"arch.mixer={arch.mixer} has no token-mixing MLP", arch.mixer != "mlp_t"),
            (too_long, bool(too_long)),
            (misaligned, bool(misaligned)),
            (
                f"train.precision resolved to {precision} (the kernel computes in bf16)",
                precision not in BF16_PRECISIONS,
            ),
            (f"the device is {device_type} (XLA compiles its own step)", device_type == "xla"),
            ("Triton is not installed", not fused_mix.available()),
            (
                "the device is cpu, where Triton runs only as its interpreter (TRITON_INTERPRET=1: slow, for tests)",
                device_type == "cpu" and not fused_mix.interpreting(),
            ),
        )
        if blocked
    ]
    if choice == AUTO:
        sm = "sm_{}{}".format(*capability) if capability else "compute capability unknown"
        if device_type == "cuda" and not blockers and capability in MEASURED_CAPABILITIES:
            return Kernels(AUTO_CUDA, f"auto: CUDA {sm}, Triton, {precision}, mlp_t")
        if device_type == "cuda" and not blockers:
            measured = ", ".join("sm_{}{}".format(*c) for c in MEASURED_CAPABILITIES)
            return Kernels(
                "torch", f"auto: CUDA {sm}: the fused kernels are measured on {measured} only (train.kernels picks one)"
            )
        return Kernels("torch", f"auto: {'; '.join(blockers) or f'the device is {device_type}'}")
    if choice in FUSED and blockers:
        raise ValueError(f"train.kernels={choice}: not possible here: {'; '.join(blockers)}")
    return Kernels(choice, f"train.kernels={choice} (explicit)")


def apply_kernels(model: ACTModel | Block, choice: str) -> None:
    """Point every block of `model` (or the one block) at `choice`'s kernels (before torch.compile traces it)."""
    from trm.model import Block

    for block in model.modules():
        if isinstance(block, Block):
            block.fused_mix = FUSED.get(choice, "off")
            block.fused_swiglu = choice in FUSED_SWIGLU
