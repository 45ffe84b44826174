"""`train.kernels`: which kernels run MLP-t's token-mixing sublayer and, with `fused_mix_swiglu`, the channel SwiGLU
(`auto` keeps torch's on a CPU and on XLA).

- `torch`: the model's torch ops (under train.compile, what inductor makes of them).
- `fused_mix`: the sublayer as one Triton kernel (trm/kernels/fused_mix.py) in every call; the calls that carry
  gradients recompute it in torch ops in the backward.
- `fused_mix_bwd`: the kernel in every call, and in the calls with gradients a Triton backward
  (trm/kernels/fused_mix_backward.py: the forward keeps the residual sum; no recompute of the forward's output).
- `fused_mix_swiglu`: `fused_mix_bwd`, and the channel SwiGLU's silu*mul inside its GEMMs (trm/kernels/fused_swiglu.py),
  forward and backward, in every call.
- `fused_mix_nograd`: the kernel only in the calls without gradients (TRM's H_cycles - 1 no-grad cycles, and eval);
  the calls with gradients keep the torch path.
- `auto` (the default): `AUTO_CUDA` on a CUDA GPU of a compute capability the kernels were measured on
  (MEASURED_CAPABILITIES: sm_90, the lent H100; docs/benchmarks.md, "Fused kernels") with Triton, when the precision
  is bf16, the mixer mlp_t, the sequence within the kernels' TMA blocks and arch.hidden_size a multiple of 8 (rows
  a TMA copy can take); else `torch`. Elsewhere the fused choices are unmeasured: below Hopper Triton compiles their
  TMA copies to plain loads that spill registers in every tile (bench/gpu/triton_sm90.py --capability 80), and a newer
  GPU may lack the shared memory the mix-backward tiles take (consumer Blackwell, sm_120, has about 100 KB); they
  stay explicit choices there.

The kernel computes in bf16 (its dots take bf16 operands as autocast's do), so an explicit fused choice with fp32,
without Triton, or on XLA is refused with the reason before the model is built. On a CPU a fused choice needs Triton's
interpreter (TRITON_INTERPRET=1): correct and slow, the tests' way to check the kernel against the torch path.

What the config allows may still not launch on this GPU: a kernel none of whose tiles fits its shared memory per
block, a Triton compile error. `launchable` finds out at model build with a trial launch of one block, and then
the model keeps torch's kernels with one warning naming why (as does `auto` on an unmeasured capability), so a run
never fails at its first step for it. SHARED_MEMORY_PER_BLOCK and `unfit_kernels` say which tiles fit where, from
what Triton's compile for that target allocates (bench/gpu/triton_sm90.py --capability; docs/benchmarks.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from contracts.choices import AUTO, check_kernels_choice

if TYPE_CHECKING:
    import torch

    from trm.model import ACTModel, Block
    from trm.model_config import TRMConfig

# choice -> trm.model.Block.fused_mix
FUSED = {"fused_mix": "all", "fused_mix_nograd": "nograd", "fused_mix_bwd": "all_bwd", "fused_mix_swiglu": "all_bwd"}
FUSED_SWIGLU = ("fused_mix_swiglu",)  # choices that also set trm.model.Block.fused_swiglu
AUTO_CUDA = "fused_mix_swiglu"  # the fastest on an H100 (docs/benchmarks.md, "Fused kernels")
# How far a fused choice's values may be from the torch path's (relative to the largest): bf16 keeps 8 bits, and
# two computations of the same function differ by a few units of 2^-8 (the tests and bench/gpu/candidates.py).
BF16_TOL = 2e-2
# The compute capabilities the fused kernels were measured on (bench/results/gpu_candidates_*.json: test_fused_mix
# keeps the two equal); `auto` picks them only there.
MEASURED_CAPABILITIES = ((9, 0),)
BF16_PRECISIONS = ("bf16", "bf16_reference")


# The Triton kernels each fused choice launches (the names bench/gpu/triton_sm90.py reports them by).
MIX_FORWARD, MIX_SAVING, MIX_BACKWARD = "fused_mix forward", "fused_mix forward (saving the sum)", "fused_mix backward"
SWIGLU_FORWARD, SWIGLU_SAVING = "fused_swiglu forward", "fused_swiglu forward (saving gate/up)"
SWIGLU_BACKWARD = "fused_swiglu backward"
KERNELS_OF = {
    "fused_mix": (MIX_FORWARD,),  # its backward recomputes in torch ops
    "fused_mix_nograd": (MIX_FORWARD,),
    "fused_mix_bwd": (MIX_FORWARD, MIX_SAVING, MIX_BACKWARD),
    "fused_mix_swiglu": (MIX_FORWARD, MIX_SAVING, MIX_BACKWARD, SWIGLU_FORWARD, SWIGLU_SAVING, SWIGLU_BACKWARD),
}
KB = 1024
# Shared memory one block may use (the opt-in maximum), per compute capability: the CUDA C++ Programming Guide,
# "Technical Specifications per Compute Capability", "Maximum amount of shared memory per thread block"; what
# Triton checks a compiled kernel against at launch is the device's own report of it (cudaDevAttrMaxSharedMemory-
# PerBlockOptin), the same numbers.
SHARED_MEMORY_PER_BLOCK: Mapping[tuple[int, int], int] = {
    (8, 0): 163 * KB,  # A100
    (8, 6): 99 * KB,  # consumer Ampere
    (8, 9): 99 * KB,  # Ada (L4, L40S, RTX 40xx)
    (9, 0): 227 * KB,  # H100, H200
    (10, 0): 227 * KB,  # B200, GB200
    (12, 0): 99 * KB,  # consumer Blackwell (RTX 50xx)
}


class TileNeed(NamedTuple):
    """The shared memory a kernel (one of KERNELS_OF's) takes at one of its tiles, as Triton compiled it for a
    target: it depends on the target, the tile's blocks and stages, and the stream's dtype."""

    kernel: str
    tile: tuple[int, ...]
    shared_bytes: int


class Kernels(NamedTuple):
    """The concrete choice (one of KERNEL_CHOICES but auto) and why it was made; `warning`: why a fused choice
    did not run here, to warn of at model build ('' when none did not)."""

    choice: str
    reason: str
    warning: str = ""


def resolve_kernels(
    requested: object, device_type: str, precision: str, arch: TRMConfig, capability: tuple[int, int] | None = None
) -> Kernels:
    """The concrete choice for `train.kernels=requested` on this device (a CUDA device's compute `capability`),
    resolved precision and architecture (its mixer, the sequence the token mixing spans, the hidden size)."""
    from trm.kernels import fused_mix

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
            why = f"auto: CUDA {sm}: the fused kernels are measured on {measured} only (train.kernels picks one)"
            return Kernels("torch", why, warning=why)
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


def unfit_kernels(choice: str, needs: Iterable[TileNeed], limit: int) -> dict[str, int]:
    """The kernels of `choice` none of whose tiles fits `limit` bytes of shared memory per block, each with its
    smallest tile's need (Triton's autotuner skips a tile that does not fit; a kernel with none cannot launch).
    A kernel with no need given is not counted."""
    smallest: dict[str, int] = {}
    for need in needs:
        if need.kernel in KERNELS_OF.get(choice, ()):
            smallest[need.kernel] = min(need.shared_bytes, smallest.get(need.kernel, need.shared_bytes))
    return {kernel: least for kernel, least in smallest.items() if least > limit}


def shared_memory_blocker(choice: str, capability: tuple[int, int] | None, needs: Iterable[TileNeed]) -> str:
    """Why `choice` cannot launch on a GPU of `capability` for its shared memory ('' if every kernel has a tile
    that fits, or the capability's limit is unknown), from the tiles' `needs` as Triton compiled them for it."""
    limit = SHARED_MEMORY_PER_BLOCK.get(capability) if capability else None
    if limit is None or capability is None or not (unfit := unfit_kernels(choice, needs, limit)):
        return ""
    sm = "sm_{}{}".format(*capability)
    kernels = "; ".join(f"the {kernel}'s smallest needs {need / KB:.0f} KB" for kernel, need in unfit.items())
    return f"no tile fits {sm}'s {limit // KB} KB of shared memory per block ({kernels})"


def launch_error(err: BaseException) -> str:
    """A failed launch's cause in one line: the shared memory (or other resource) no tile fits, a Triton compile
    error, or the exception's type and first line."""
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources, PTXASError

    first = (str(err).strip().splitlines() or [""])[0][:300]
    if isinstance(err, OutOfResources):
        return f"no tile fits the GPU's {err.name} (Triton: {first})"
    if isinstance(err, (CompilationError, PTXASError)):
        return f"Triton compile error ({type(err).__name__}: {first})"
    return f"{type(err).__name__}: {first}"


def trial_launch(choice: str, arch: TRMConfig, device: torch.device, precision: str, batch: int) -> str:
    """'' if one block of `arch` runs forward without gradients and forward + backward with `choice`'s kernels on
    `device` ([batch, seq, hidden] in the precision's carry dtype, under its autocast: every kernel of the choice,
    the shapes the training step gives them, so Triton's autotuner has tuned them for it), else why not. The
    global RNG is left as it was: the model built after it draws the weights it would draw without it."""
    import torch

    from trm.model import Block
    from trm.step import autocast, carry_dtype

    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        block = Block(arch).to(device)
        apply_kernels(block, choice)
        h = torch.randn(batch, arch.total_len, arch.hidden_size, device=device).to(carry_dtype(precision))
        try:
            with autocast(precision, device):
                with torch.no_grad():
                    block(h)
                block(h.requires_grad_()).float().sum().backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as err:  # noqa: BLE001 - any failure of the kernels here is why the model keeps torch's
            return launch_error(err)
    return ""


def launchable(kernels: Kernels, arch: TRMConfig, device: torch.device, precision: str, batch: int) -> Kernels:
    """`kernels` if its choice launches here (trial_launch; a choice without fused kernels is not tried), else
    torch's with why; in either case one warning at model build when a fused choice does not run (`warning`)."""
    if kernels.choice in FUSED and (failure := trial_launch(kernels.choice, arch, device, precision, batch)):
        why = f"train.kernels={kernels.choice} cannot launch on this {device.type} device: {failure}"
        kernels = Kernels("torch", f"{kernels.reason}; {why}: torch's kernels", warning=why)
    if kernels.warning:
        warnings.warn(f"{kernels.warning}; the model keeps torch's kernels", RuntimeWarning, stacklevel=2)
    return kernels
