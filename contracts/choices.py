"""The training choices: `train.compile`, `runtime.device`, `train.precision`, `train.bf16_mode` and `train.kernels`.
Their `Literal` types are the training config's schema's (contracts/train_config.py: Hydra refuses another value as
it composes, for a job and for the sweep's validation of its trials); the checks below are for code that takes a
choice as an argument. Each names the key, the value and what is accepted.

What each choice does lives beside the code that does it (trm/compiling.py, trm/runtime/devices.py, trm/precision.py);
the accepted values live here so the driver can refuse a typo without importing torch."""

from __future__ import annotations

from typing import Any, Literal, get_args

Compile = Literal["off", "net", "model"]  # train.compile
CompileSetting = Literal[Compile, True, False]  # what the schema takes for it: true = net, false = off
Device = Literal["auto", "cpu", "cuda"]  # runtime.device
PrecisionMode = Literal["fp32", "bf16", "bf16_reference"]  # the keys of trm.step.PRECISIONS: what the step runs
Bf16Mode = Literal["bf16", "bf16_reference"]  # what train.bf16_mode may ask `auto` for
PrecisionRequest = Literal["auto", "fp32", "bf16", "bf16_reference"]  # what train.precision accepts
KernelChoice = Literal[
    "auto", "torch", "fused_mix", "fused_mix_nograd", "fused_mix_bwd", "fused_mix_swiglu"
]  # train.kernels (trm/kernel_choice.py)

COMPILE_CHOICES: tuple[str, ...] = get_args(Compile)
DEVICE_CHOICES: tuple[str, ...] = get_args(Device)
AUTO = "auto"
PRECISION_MODES: tuple[str, ...] = get_args(PrecisionMode)
BF16_MODES: tuple[str, ...] = get_args(Bf16Mode)
PRECISION_REQUESTS: tuple[str, ...] = get_args(PrecisionRequest)
KERNEL_CHOICES: tuple[str, ...] = get_args(KernelChoice)


def compile_mode(value: Any) -> str:
    """The compile choice for `train.compile=value`; a clear error for anything else."""
    if value is True:
        return "net"
    if value is False or value is None:
        return "off"
    if value not in COMPILE_CHOICES:
        raise ValueError(
            f"train.compile={value!r}: expected one of {list(COMPILE_CHOICES)} (or true = net, false = off)"
        )
    return str(value)


def check_device_choice(value: Any) -> str:
    """`runtime.device=value` if it is one of the choices, else a ValueError naming the key and the choices."""
    if value not in DEVICE_CHOICES:
        raise ValueError(f"runtime.device={value!r}: expected one of {list(DEVICE_CHOICES)}")
    return str(value)


def check_precision_choice(precision: str, bf16_mode: str) -> None:
    """Refuse an unknown `train.precision` or `train.bf16_mode`, naming the key, the value and what is accepted."""
    if precision not in PRECISION_REQUESTS:
        raise ValueError(f"train.precision={precision!r}: expected one of {list(PRECISION_REQUESTS)}")
    if bf16_mode not in BF16_MODES:
        raise ValueError(f"train.bf16_mode={bf16_mode!r}: expected one of {list(BF16_MODES)}")


def check_kernels_choice(value: object) -> str:
    """`train.kernels=value` as a choice; a clear error for anything else."""
    if value not in KERNEL_CHOICES:
        raise ValueError(f"train.kernels={value!r}: expected one of {list(KERNEL_CHOICES)}")
    return str(value)
